"""MIG strategy env for the device plugin, GFD and the MPS control daemon."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render.objects import upsert_env


def mig_strategy_env(ctr: dict[str, Any], spec: ClusterPolicySpec) -> None:
    strategy = spec.mig.strategy
    if strategy is None:
        upsert_env(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all")
        return
    upsert_env(ctr, "MIG_STRATEGY", strategy)
    if strategy != "none":
        upsert_env(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all")
