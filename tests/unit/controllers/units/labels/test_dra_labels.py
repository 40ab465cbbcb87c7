"""Node labels of the DRA stack (GPUCluster) and the switch between the two stacks."""

from __future__ import annotations

from gpu_operator.controllers.gpuholders import claim_holding_nodes
from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy, desired_change
from gpu_operator.vocabulary import (
    DRA_DRIVER_LABEL,
    DRA_STATE_LABELS,
    UPGRADE_ENABLED_ANNOTATION,
    deploy_label,
)

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/gpu.present": "true"}
DRA = LabelPolicy(dra=True)
DEVICE_PLUGIN_STACK = {
    deploy_label(c): "true"
    for c in (
        "driver",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "operator-validator",
        "mig-manager",
    )
}


def test_a_gpu_node_gets_the_dra_set_and_loses_the_device_plugin_set() -> None:
    labels = {**GPU, **DEVICE_PLUGIN_STACK, deploy_label("vgpu-manager"): "true"}
    change = desired_change(labels, {UPGRADE_ENABLED_ANNOTATION: "true"}, DRA)
    wanted = {k: "true" for k in DRA_STATE_LABELS if k != deploy_label("driver")}  # driver is kept as is
    assert {k: v for k, v in change.labels.items() if v is not None} == wanted
    removed = {k for k, v in change.labels.items() if v is None}
    assert removed == set(DEVICE_PLUGIN_STACK) - {deploy_label("driver")}  # vgpu-manager spared, as upstream
    assert change.annotations == {UPGRADE_ENABLED_ANNOTATION: None}


def test_dra_values_set_by_others_are_kept_and_the_operands_switch_does_not_apply() -> None:
    labels = {
        **GPU,
        **{k: "true" for k in DRA_STATE_LABELS},
        deploy_label("dra-validator"): "paused-for-driver-upgrade",
        "nvidia.com/gpu.deploy.operands": "false",
    }
    assert not desired_change(labels, {}, DRA)


def test_a_node_without_gpu_keeps_no_dra_label() -> None:
    labels = {"nvidia.com/gpu.present": "true", **{k: "true" for k in DRA_STATE_LABELS}}
    change = desired_change(labels, {}, DRA)
    assert change.labels["nvidia.com/gpu.present"] == "false"
    assert {k for k, v in change.labels.items() if v is None} == set(DRA_STATE_LABELS)


def test_leaving_dra_waits_for_the_node_claims_before_the_driver_label_goes() -> None:
    labels = {**GPU, **{k: "true" for k in DRA_STATE_LABELS}}
    held = desired_change(labels, {}, LabelPolicy(claim_holders=frozenset({"n1"})), node="n1")
    assert DRA_DRIVER_LABEL not in held.labels  # stays while a pod holds a claim
    assert (
        held.labels[deploy_label("dra-validator")] is None
        and held.labels[deploy_label("device-plugin")] == "true"
    )
    free = desired_change(labels, {}, LabelPolicy(claim_holders=frozenset({"n1"})), node="n2")
    assert free.labels[DRA_DRIVER_LABEL] is None


def test_claim_holders_are_nodes_of_reserved_gpu_claims() -> None:
    def claim(pool: str, driver: str = "gpu.nvidia.com", reserved: bool = True) -> dict[str, object]:
        status: dict[str, object] = {
            "allocation": {
                "devices": {
                    "results": [{"driver": driver, "pool": pool, "device": "gpu-0", "request": "gpu"}]
                }
            }
        }
        if reserved:
            status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
        return {"status": status}

    claims = [claim("n1"), claim("n2", reserved=False), claim("n3", driver="compute-domain.nvidia.com"), {}]
    assert claim_holding_nodes(claims) == frozenset({"n1"})


def test_with_nvidiadrivers_the_dra_stack_gets_owner_labels_and_their_upgrade_switch() -> None:
    from gpu_operator.controllers.queries import NodeDriver
    from gpu_operator.vocabulary import DRIVER_OWNER

    labels = {**GPU, **{k: "true" for k in DRA_STATE_LABELS}}
    change = desired_change(
        labels,
        {},
        LabelPolicy(dra=True, use_nvidia_driver_crd=True),
        NodeDriver(owner="default", auto_upgrade=True),
    )
    assert change.labels == {DRIVER_OWNER: "default"}
    assert change.annotations == {UPGRADE_ENABLED_ANNOTATION: "true"}


def test_leaving_dra_lists_the_claims_once_per_recheck_not_per_pass() -> None:
    import asyncio
    from dataclasses import replace as dc_replace
    from typing import Any

    from gpu_operator.controllers.readmodel import ReadModel
    from gpu_operator.controllers.settings import OperatorSettings
    from gpu_operator.controllers.units.labels.unit import LabelUnit
    from gpu_operator.controllers.views import NodeView

    held = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0", "request": "gpu"}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        }
    }

    class Claims:
        lists = 0

        async def list_resource_claims(self, namespace: str | None = None) -> list[Any]:
            assert namespace is None  # every namespace
            self.lists += 1
            return [held]

    def view(name: str, labels: dict[str, str]) -> NodeView:
        return NodeView(name=name, labels=labels, annotations={}, runtime="containerd", kernel="6.1")

    kube = Claims()
    settings = OperatorSettings()
    views = {"n1": view("n1", {DRA_DRIVER_LABEL: "true"}), "n2": view("n2", {DRA_DRIVER_LABEL: "true"})}
    model = ReadModel("gpu-operator", node_map=views)
    loop = LabelUnit(kube, settings, model)  # type: ignore[arg-type]

    async def passes() -> list[frozenset[str]]:
        seen = [(await loop._claims(LabelPolicy())).claim_holders for _ in range(5)]
        del views["n2"]  # its label went: it is no holder whatever the last list said
        seen.append((await loop._claims(LabelPolicy())).claim_holders)
        loop.settings = dc_replace(settings, claim_recheck=0.0)  # the recheck is due: listed again
        held["status"] = {}  # the claim was released meanwhile
        seen.append((await loop._claims(LabelPolicy())).claim_holders)
        return seen

    seen = asyncio.run(passes())
    assert seen[:6] == [frozenset({"n1"})] * 6
    assert seen[6] == frozenset()
    assert kube.lists == 2
