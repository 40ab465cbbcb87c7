"""`gpu-operator sim ...` without the `sim` extra names the extra to install."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app

ROOT = Path(__file__).resolve().parents[3]


def test_sim_without_cryptography_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "cryptography" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = CliRunner().invoke(app, ["sim", "status", "--dir", "/nonexistent"])
    assert result.exit_code == 2
    assert "gpu-operator[sim]" in result.output


def test_only_the_sim_extra_pulls_cryptography_and_test_pulls_sim() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("cryptography")]
    assert [d for d in project["optional-dependencies"]["sim"] if d.startswith("cryptography==")]
    assert "gpu-operator[sim]" in project["optional-dependencies"]["test"]
