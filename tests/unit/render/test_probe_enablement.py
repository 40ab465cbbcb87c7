"""The GPU probe runs wherever the KubeVirt sync needs its facts (sandbox workloads on), whatever
vfioManager says; the vfio manager's DaemonSet and RBAC only with vfioManager on. And a VMPassthrough
condition that could not see a passthrough node's GPUs (no probe facts) is not True: it names the
nodes and where to look."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render import kubevirt as kv
from gpu_operator.render.states.vfio_manager import NAME as VFIO
from gpu_operator.render.states.vfio_manager import PROBE
from gpu_operator.vocabulary import HOST_DEVICES_SYNCED, PROBE_FACTS_ANNOTATION, PROBE_FACTS_MISSING
from tests.unit.render.renderkit import facts, policy
from tests.unit.render.test_kubevirt import facts as probe_facts
from tests.unit.render.test_kubevirt import node


def vfio_state(spec: dict[str, Any]) -> tuple[bool, set[tuple[str, str]]]:
    from gpu_operator.render import render

    state = render(policy(spec), facts("vfio-passthrough:2")).state("state-vfio-manager")
    for obj in state.objects:  # both agents write their Node: each pod keeps its ServiceAccount token
        if obj["kind"] == "DaemonSet":
            assert obj["spec"]["template"]["spec"].get("automountServiceAccountToken", True), obj["metadata"][
                "name"
            ]
    return state.enabled, {(o["kind"], o["metadata"]["name"]) for o in state.objects}


@pytest.mark.parametrize("vfio_on", [True, False])
def test_the_probe_runs_with_sandbox_workloads_whatever_vfio_manager_says(vfio_on: bool) -> None:
    enabled, objects = vfio_state(
        {"sandboxWorkloads": {"enabled": True}, "vfioManager": {"enabled": vfio_on}}
    )
    assert enabled
    probe = {
        ("ServiceAccount", PROBE),
        ("ClusterRole", PROBE),
        ("ClusterRoleBinding", PROBE),
        ("DaemonSet", PROBE),
    }
    vfio = {
        ("ServiceAccount", VFIO),
        ("ClusterRole", VFIO),
        ("ClusterRoleBinding", VFIO),
        ("DaemonSet", VFIO),
    }
    assert probe <= objects
    assert (vfio <= objects) if vfio_on else not (vfio & objects), objects


def test_without_sandbox_workloads_neither_runs() -> None:
    enabled, objects = vfio_state({"vfioManager": {"enabled": True}})
    assert not enabled and objects == set()


def spec() -> ClusterPolicySpec:
    return ClusterPolicySpec.model_validate(
        {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "container"}}
    )


def test_a_node_whose_gpus_are_not_seen_keeps_the_condition_from_true() -> None:
    inv = kv.inventory(
        [node("seen", probe_facts("vfio-pci")), node("blind-a", {}), node("blind-b", {})], spec()
    )
    assert inv.no_facts == ["blind-a", "blind-b"]
    text = kv.summary(inv, kv.desired_entries(inv.bound, external=False))
    cond = kv.condition(list(inv.findings), True, text, inv.no_facts)
    assert (cond["status"], cond["reason"]) == ("False", PROBE_FACTS_MISSING)
    assert "blind-a, blind-b" in cond["message"] and PROBE_FACTS_ANNOTATION in cond["message"]
    assert "kubectl get pods -A -l app=nvidia-gpu-probe -o wide" in cond["message"]  # where to look


def test_every_node_seen_is_synced() -> None:
    inv = kv.inventory([node("a", probe_facts("vfio-pci"))], spec())
    cond = kv.condition(list(inv.findings), True, kv.summary(inv, []), inv.no_facts)
    assert (cond["status"], cond["reason"]) == ("True", HOST_DEVICES_SYNCED)


def test_a_finding_still_comes_first() -> None:
    finding = kv.KubeVirtFinding("HostDeviceListedByOthers", "someone else lists it")
    cond = kv.condition([finding], True, "text", ["blind"])
    assert (cond["status"], cond["reason"]) == ("False", "HostDeviceListedByOthers")
