"""`gpu-operator health status|retry|hold` against a recorded fake Kube."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpu_operator.admin import health_cli
from gpu_operator.controllers.units.health import machine as hm
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_STATE
from tests.unit.controllers.healthkit import FakeKube


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    fake = FakeKube()
    fake.add_node(
        "g1", {hm.ATTEMPTS: "3", hm.REASON: "3 remediation attempts failed"}, labels={HEALTH_STATE: hm.FAILED}
    )
    fake.nodes["g1"]["status"]["conditions"] = [
        {
            "type": HEALTH_CONDITION,
            "status": "False",
            "reason": "RemediationFailed",
            "message": "failed: GPU x",
        }
    ]
    fake.add_node("g2")

    def run_kube(kubeconfig: str | None, what: str, fn: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
        return asyncio.run(fn(fake))

    monkeypatch.setattr("gpu_operator.kube.reach.run_kube", run_kube)
    return fake


def app() -> typer.Typer:
    root = typer.Typer()
    health_cli.register(root)
    return root


def test_status_lists_reporting_nodes_and_exits_1_on_a_failed_one(kube: FakeKube) -> None:
    result = CliRunner().invoke(app(), ["health", "status"])
    assert result.exit_code == 1
    rows = [line.split() for line in result.output.splitlines() if line.startswith("  ")]
    assert [r[0] for r in rows] == ["g1"] and rows[0][1] == "failed"


def test_retry_and_hold_write_the_state_label(kube: FakeKube) -> None:
    assert CliRunner().invoke(app(), ["health", "retry", "g1"]).exit_code == 0
    meta = kube.nodes["g1"]["metadata"]
    assert meta["labels"][HEALTH_STATE] == hm.QUARANTINED and hm.ATTEMPTS not in meta["annotations"]
    assert CliRunner().invoke(app(), ["health", "hold", "g2", "--reason", "bad fan"]).exit_code == 0
    meta = kube.nodes["g2"]["metadata"]
    assert meta["labels"][HEALTH_STATE] == hm.HELD and meta["annotations"][hm.REASON] == "bad fan"
    missing = CliRunner().invoke(app(), ["health", "retry", "nope"])
    assert missing.exit_code == 2
