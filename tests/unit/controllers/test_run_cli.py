"""`gpu-operator run` by hand: a missing --namespace names the fix; image variables the chart's
Deployment would set fall back to the chart's defaults, in one log line (the operator loop itself
is replaced: no cluster needed)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.controllers import run as run_module
from gpu_operator.controllers.environment import Environment
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No image variable set, OPERATOR_NAMESPACE restored afterwards; returns the images of the
    environment the operator was handed (read once, at start: controllers/environment.py)."""
    for name in [*CHART_DEFAULT_IMAGES, "OPERATOR_NAMESPACE"]:
        monkeypatch.setenv(name, "-")  # recorded, so that the test's writes are undone
        monkeypatch.delenv(name)
    seen: dict[str, str] = {}

    async def loop(environment: Environment, *args: Any) -> int:
        seen.update(environment.images)
        seen["namespace"] = environment.namespace
        return 0

    monkeypatch.setattr(run_module, "run", loop)
    return seen


def test_without_image_variables_the_charts_defaults_apply_in_one_line(
    operator_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DRIVER_IMAGE", "registry.example.com/nvidia/driver:580.95.05")
    monkeypatch.setenv("GDS_IMAGE", "")  # set empty on purpose: no fallback
    caplog.set_level(logging.INFO, logger="gpu_operator")
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--namespace",
            "gpu-operator",
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    assert operator_env["DRIVER_IMAGE"] == "registry.example.com/nvidia/driver:580.95.05"
    assert "GDS_IMAGE" not in operator_env  # no fallback: the renderer's own default rule applies
    assert operator_env["namespace"] == "gpu-operator"
    assert operator_env["DCGM_IMAGE"] == CHART_DEFAULT_IMAGES["DCGM_IMAGE"]
    (line,) = [r.getMessage() for r in caplog.records if "chart's defaults" in r.getMessage()]
    assert f"DCGM_IMAGE={CHART_DEFAULT_IMAGES['DCGM_IMAGE']}" in line
    assert " DRIVER_IMAGE=" not in line and "GDS_IMAGE" not in line


def test_a_missing_namespace_names_the_option_and_an_example(operator_env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == 2
    assert "--namespace gpu-operator" in " ".join(result.output.replace("│", "").split())
    assert operator_env == {}  # the operator never started
