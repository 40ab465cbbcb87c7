"""An event that only echoes our own status write starts no pass; every other event does."""

from __future__ import annotations

import copy
from typing import Any

from gpu_operator.controllers.echoes import StatusEchoes


def policy(
    rv: str = "1",
    generation: int = 1,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": "cluster-policy",
            "uid": "u1",
            "resourceVersion": rv,
            "generation": generation,
            "annotations": annotations or {},
        },
        "spec": {"driver": {"enabled": True}},
        "status": status or {},
    }


def echoes(written: dict[tuple[str, str], dict[str, Any]]) -> StatusEchoes:
    return StatusEchoes(lambda name: written.get(("ClusterPolicy", name)))


def test_the_echo_of_our_status_write_is_an_echo() -> None:
    written: dict[tuple[str, str], dict[str, Any]] = {}
    filt = echoes(written)
    assert not filt.is_echo(policy(), None)  # the initial listing
    ours = {"state": "notReady", "namespace": "gpu-operator"}
    written[("ClusterPolicy", "cluster-policy")] = ours
    assert filt.is_echo(policy(rv="2", status={**ours, "extra": 1}), "MODIFIED")


def test_everything_else_kicks() -> None:
    ours = {"state": "notReady", "namespace": "gpu-operator"}
    written = {("ClusterPolicy", "cluster-policy"): ours}
    filt = echoes(written)
    assert not filt.is_echo(policy(status=ours), "ADDED")
    # a spec change (generation), an annotation (the upgrade pause), a status someone else wrote
    assert not filt.is_echo(policy(rv="2", generation=2, status=ours), "MODIFIED")
    assert not filt.is_echo(
        policy(
            rv="3", generation=2, status=ours, annotations={"nvidia.com/gpu-driver-upgrade-paused": "true"}
        ),
        "MODIFIED",
    )
    other = policy(
        rv="4",
        generation=2,
        status={"state": "ready"},
        annotations={"nvidia.com/gpu-driver-upgrade-paused": "true"},
    )
    assert not filt.is_echo(other, "MODIFIED")
    assert not filt.is_echo(copy.deepcopy(other), "DELETED")
    # before any write of ours, a status-only change is not ours
    assert not echoes({}).is_echo(policy(rv="5", status=ours), "MODIFIED")


def test_a_status_only_event_after_a_spec_change_it_did_not_see_kicks() -> None:
    ours = {"state": "ready"}
    filt = echoes({("ClusterPolicy", "cluster-policy"): ours})
    assert not filt.is_echo(policy(status=ours), None)
    assert filt.is_echo(policy(rv="2", status=ours), "MODIFIED")
    # the spec changed and our status came with it in one event: the spec change wins
    assert not filt.is_echo(policy(rv="3", generation=2, status=ours), "MODIFIED")
