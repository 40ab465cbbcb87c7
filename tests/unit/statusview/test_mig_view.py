"""MIG in `gpu-operator status`: each node's config and state in a column, the operator's
NvidiaMIGReady reason where a change is stuck, failed or invalid, and a problems line for those."""

from __future__ import annotations

from typing import Any

from gpu_operator.statusview.mig import NodeMIG, node_mig, problems
from gpu_operator.statusview.render import node_table
from gpu_operator.statusview.table import build_view
from gpu_operator.vocabulary import MIG_CONDITION, MIG_CONFIG, MIG_CONFIG_STATE


def gpu_node(
    name: str,
    config: str | None = None,
    state: str | None = None,
    reason: str | None = None,
    message: str = "",
) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.present": "true",
        **({MIG_CONFIG: config} if config else {}),
        **({MIG_CONFIG_STATE: state} if state else {}),
    }
    conditions = (
        [{"type": MIG_CONDITION, "status": "False", "reason": reason, "message": message}] if reason else []
    )
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": conditions}}


def test_node_mig_reads_labels_and_condition() -> None:
    stuck = node_mig(
        gpu_node("g1", "all-1g.10gb", "pending", "MIGChangeStuck", "GPU clients that did not stop: x")
    )
    assert stuck == NodeMIG(
        "g1", "all-1g.10gb", "pending", "MIGChangeStuck", "GPU clients that did not stop: x"
    )
    assert stuck.text == "all-1g.10gb: pending (MIGChangeStuck)"
    assert (
        node_mig(gpu_node("g2", "all-disabled", "success", "MIGConfigApplied")).text
        == "all-disabled: success"
    )
    assert node_mig(gpu_node("g3", "all-disabled")).text == "all-disabled: not started"
    assert node_mig(gpu_node("g4")).text == ""
    rows = [
        stuck,
        node_mig(gpu_node("g2", "all-disabled", "success", "MIGConfigApplied")),
        node_mig(gpu_node("g5", "nope", "failed", "InvalidMIGConfig", "valid names: a, b")),
    ]
    assert problems(rows) == [
        "MIG: node g1 MIGChangeStuck: GPU clients that did not stop: x",
        "MIG: node g5 InvalidMIGConfig: valid names: a, b",
    ]


def test_status_has_a_mig_column_only_where_a_node_has_a_config_and_lists_the_stuck() -> None:
    view = build_view(
        [gpu_node("g1", "all-1g.10gb", "pending", "MIGChangeStuck", "why")], [], [], [], "gpu-operator"
    )
    assert view.rows[0].mig is not None and view.rows[0].mig.state == "pending"
    assert "mig" in [c.header for c in node_table(view).columns]
    assert "MIG: node g1 MIGChangeStuck: why" in view.problems
    bare = build_view([gpu_node("g0")], [], [], [], "gpu-operator")
    assert "mig" not in [c.header for c in node_table(bare).columns]
