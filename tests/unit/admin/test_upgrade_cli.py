"""`gpu-operator upgrade`: which objects pause/resume annotate and how status prints each owner's
upgradePolicy (the pure parts of admin/upgrade_cli.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.admin.upgrade_cli import pause_targets, policy_line
from gpu_operator.vocabulary import UPGRADE_PAUSED_ANNOTATION


def obj(name: str, spec: dict[str, Any] | None = None, *, paused: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if paused:
        meta["annotations"] = {UPGRADE_PAUSED_ANNOTATION: "true"}
    return {"metadata": meta, "spec": spec or {}}


CP = obj("cluster-policy")
CP_CRD = obj("cluster-policy", {"driver": {"useNvidiaDriverCRD": True}})
DRIVERS = [obj("pool-a"), obj("pool-b")]


def test_pause_goes_where_the_controller_reads_it() -> None:
    assert pause_targets(CP, DRIVERS, None) == [("ClusterPolicy", "cluster-policy")]
    assert pause_targets(CP_CRD, DRIVERS, None) == [("NVIDIADriver", "pool-a"), ("NVIDIADriver", "pool-b")]
    assert pause_targets(None, DRIVERS, "pool-b") == [("NVIDIADriver", "pool-b")]
    with pytest.raises(LookupError, match="no NVIDIADriver pool-c .there are: pool-a, pool-b"):
        pause_targets(CP_CRD, DRIVERS, "pool-c")
    with pytest.raises(LookupError, match="there is none"):
        pause_targets(CP_CRD, [], None)
    with pytest.raises(LookupError, match="no ClusterPolicy"):
        pause_targets(None, DRIVERS, None)


def test_policy_line_uses_each_kinds_defaults_and_shows_pause() -> None:
    assert policy_line("ClusterPolicy", CP) == (
        "ClusterPolicy cluster-policy: autoUpgrade=False maxParallelUpgrades=1 maxUnavailable=25%"
    )
    assert policy_line(
        "NVIDIADriver", obj("pool-a", {"upgradePolicy": {"maxParallelUpgrades": 3}}, paused=True)
    ) == (
        "NVIDIADriver pool-a: autoUpgrade=True maxParallelUpgrades=3 maxUnavailable=25%"
        "  PAUSED (gpu-operator upgrade resume --nvidiadriver pool-a)"
    )
    cp = obj("cp", {"driver": {"upgradePolicy": {"autoUpgrade": True, "maxUnavailable": 2}}}, paused=True)
    assert policy_line("ClusterPolicy", cp) == (
        "ClusterPolicy cp: autoUpgrade=True maxParallelUpgrades=1 maxUnavailable=2  PAUSED (gpu-operator upgrade resume)"
    )
    assert "not valid" in policy_line(
        "NVIDIADriver", obj("x", {"upgradePolicy": {"maxParallelUpgrades": -1}})
    )
