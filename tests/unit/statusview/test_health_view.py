"""GPU health in `gpu-operator status`: the column, the problems; read from what the operator writes."""

from __future__ import annotations

from typing import Any

from gpu_operator.statusview.health import node_health, problems
from gpu_operator.statusview.render import node_table
from gpu_operator.statusview.table import build_view
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_CONDITION,
    HEALTH_REASON_ANNOTATION,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
    HEALTH_TAINT,
)

NOW = 1_000_000.0


def gpu_node(
    name: str,
    status: str = "True",
    reason: str = "GPUsHealthy",
    state: str = "",
    notes: dict[str, str] | None = None,
    tainted: bool = False,
) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.present": "true", **({HEALTH_STATE: state} if state else {})}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": dict(notes or {})},
        "spec": {"taints": [{"key": HEALTH_TAINT, "effect": "NoSchedule"}] if tainted else []},
        "status": {
            "conditions": [
                {
                    "type": HEALTH_CONDITION,
                    "status": status,
                    "reason": reason,
                    "message": "GPU 0000:3b:00.0 unhealthy: Xid 79, action reboot",
                }
            ]
        },
    }


def test_node_health_reads_condition_state_and_notes() -> None:
    failed = node_health(
        gpu_node(
            "g1",
            "False",
            "RemediationFailed",
            "failed",
            {
                HEALTH_SINCE_ANNOTATION: str(int(NOW) - 300),
                HEALTH_ATTEMPTS_ANNOTATION: "3",
                HEALTH_REASON_ANNOTATION: "3 remediation attempts failed",
            },
            tainted=True,
        ),
        NOW,
    )
    assert (failed.remediation, failed.attempts, failed.why, failed.tainted) == (
        "failed",
        3,
        "3 remediation attempts failed",
        True,
    )
    assert failed.text == "failed 5m"
    quarantined = node_health(gpu_node("g2", "False", "GPUUnhealthy", tainted=True))
    assert quarantined.text == "GPUUnhealthy (tainted)"
    assert node_health(gpu_node("g3")).text == "ready"
    assert node_health({"metadata": {"name": "g4"}}).text == ""
    assert len(problems([failed, quarantined, node_health(gpu_node("g3"))])) == 2


def test_status_table_has_a_health_column_only_when_a_node_reports() -> None:
    with_health = build_view(
        [gpu_node("g1", "False", "GPUUnhealthy", tainted=True)], [], [], [], "gpu-operator"
    )
    assert with_health.rows[0].health is not None and with_health.rows[0].health.reason == "GPUUnhealthy"
    assert "health" in [c.header for c in node_table(with_health).columns]
    bare = {"metadata": {"name": "g0", "labels": {"nvidia.com/gpu.present": "true"}}}
    assert "health" not in [
        c.header for c in node_table(build_view([bare], [], [], [], "gpu-operator")).columns
    ]
