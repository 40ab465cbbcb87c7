"""GPU health on the DRA stack: which DeviceTaintRules for which report (controllers/units/health/dra.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpu_operator.api.health import HealthReport, NodeReport
from gpu_operator.controllers.units.health import dra as hd
from gpu_operator.kube import devicetaints
from gpu_operator.vocabulary import HEALTH_TAINT, MANAGED_BY, MANAGED_BY_VALUE
from tests.unit.controllers.healthkit import FakeDRA, slice_of

OWNER = {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "name": "gpu-cluster", "uid": "u-1"}
BUS0, BUS1 = "0000:3b:00.0", "0000:86:00.0"


def report(*gpus: dict[str, Any]) -> HealthReport:
    """The report as the health unit parsed it this pass."""
    worst = max(
        (g["state"] for g in gpus), key=("healthy", "warning", "unhealthy", "gone").index, default="healthy"
    )
    return HealthReport.parse(
        json.dumps(
            {
                "v": 1,
                "validated": True,
                "state": worst,
                "action": "none",
                "healthy": 2 - len(gpus),
                "gpus": list(gpus),
                "sources": ["kmsg"],
            }
        )
    )


def sick(bus: str, state: str = "unhealthy") -> dict[str, Any]:
    return {"bus": bus, "state": state, "action": "reboot", "reason": "fell off the bus", "xid": 79}


def test_bus_ids_fold_nvml_form_and_refuse_garbage() -> None:
    assert hd.normal_bus("00000000:3B:00.0") == BUS0
    assert hd.normal_bus("0000:3b:00.0") == BUS0
    assert hd.normal_bus("00010000:3b:00.0") is None  # a domain beyond 16 bits
    assert hd.normal_bus("3b:00.0") is None
    assert hd.normal_bus("0000:3b:00.9") is None


def test_device_names_come_from_the_pci_bus_id_attribute_of_our_driver_only() -> None:
    slices = [
        slice_of("n1", ("gpu-0", "00000000:3B:00.0"), ("gpu-1", BUS1), ("gpu-0-mig-1g", None)),
        slice_of("n1", ("other-0", "0000:99:00.0"), driver="example.com"),
    ]
    assert hd.device_names(slices) == {BUS0: "gpu-0", BUS1: "gpu-1"}


def test_one_rule_per_unhealthy_or_gone_gpu_the_slice_names() -> None:
    names = {BUS0: "gpu-0", BUS1: "gpu-1"}
    buses = hd.sick_buses(report(sick(BUS0), sick(BUS1, "gone")))
    assert buses == {BUS0: "unhealthy", BUS1: "gone"}
    want = hd.wanted("n1", buses, names, OWNER)
    assert sorted(want) == ["gpu-health-n1-gpu-0", "gpu-health-n1-gpu-1"]
    body = want["gpu-health-n1-gpu-0"]
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "DeviceTaintRule"  # GA from 1.37
    assert body["metadata"]["labels"] == {MANAGED_BY: MANAGED_BY_VALUE}
    assert body["metadata"]["ownerReferences"] == [OWNER]
    assert body["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
        "taint": {"key": HEALTH_TAINT, "value": "unhealthy", "effect": "NoSchedule"},
    }
    assert want["gpu-health-n1-gpu-1"]["spec"]["taint"]["value"] == "gone"
    beta = hd.wanted("n1", buses, names, OWNER, "v1beta2")["gpu-health-n1-gpu-0"]  # Kubernetes 1.36
    assert beta["apiVersion"] == "resource.k8s.io/v1beta2" and beta["spec"] == body["spec"]


def test_warnings_and_unknown_buses_get_no_rule() -> None:
    warning = {"bus": BUS0, "state": "warning", "action": "restart-app", "reason": "Xid 13", "xid": 13}
    assert hd.sick_buses(report(warning)) == {}
    assert (
        hd.wanted("n1", {BUS1: "unhealthy"}, {BUS0: "gpu-0"}, OWNER) == {}
    )  # not published: not allocatable
    assert (
        hd.sick_buses(None) is None and hd.sick_buses(NodeReport.of("not json").report) is None
    )  # unreadable: rules stay


def test_plan_creates_missing_deletes_healed_and_replaces_changed() -> None:
    names = {BUS0: "gpu-0", BUS1: "gpu-1"}
    have = hd.wanted("n1", {BUS0: "unhealthy", BUS1: "unhealthy"}, names, OWNER)
    want = hd.wanted("n1", {BUS1: "gone"}, names, OWNER)
    steps = hd.plan(want, have)
    assert steps.delete == ["gpu-health-n1-gpu-0", "gpu-health-n1-gpu-1"]
    assert [b["metadata"]["name"] for b in steps.create] == ["gpu-health-n1-gpu-1"]
    assert hd.plan(want, want).empty


def test_long_node_names_stay_object_names() -> None:
    name = hd.rule_name("n" * 250, "gpu-7")
    assert len(name) == 253 and name.startswith("gpu-health-nnn")
    assert name != hd.rule_name("n" * 251, "gpu-7")


def test_device_taints_follow_the_report_and_forget_a_gone_node(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDRA("v1", [slice_of("n1", ("gpu-0", BUS0), ("gpu-1", BUS1))])
    fake.install(monkeypatch)
    taints = hd.DeviceTaints(None, lambda: OWNER)  # type: ignore[arg-type]

    async def run() -> None:
        assert await taints.node("n1", report()) is False
        assert fake.calls == ["discover", "list"]  # healthy, nothing kept: no slice read
        await taints.node("n1", report(sick(BUS1)))
        assert list(fake.rules) == ["gpu-health-n1-gpu-1"]
        calls = len(fake.calls)
        await taints.node("n1", report(sick(BUS1)))  # as it should be: no write
        assert fake.calls[calls:] == ["slices"]
        assert await taints.pools() == {"n1"}
        await taints.node("n1", report())  # healthy again
        assert fake.rules == {}
        await taints.node("n1", report(sick(BUS0, "gone")))
        await taints.node("n1", None, gone=True)  # the node went
        assert fake.rules == {}
        assert fake.calls.count("discover") == 1 and fake.calls.count("list") == 1

    asyncio.run(run())


def test_a_sick_gpu_not_published_yet_asks_to_look_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDRA("v1beta2", [])  # Kubernetes 1.36 with the beta API on
    fake.install(monkeypatch)
    taints = hd.DeviceTaints(None, lambda: OWNER)  # type: ignore[arg-type]
    assert asyncio.run(taints.node("n1", report(sick(BUS0)))) is True
    fake.slices.append(slice_of("n1", ("gpu-0", BUS0)))
    assert asyncio.run(taints.node("n1", report(sick(BUS0)))) is False
    assert list(fake.rules) == ["gpu-health-n1-gpu-0"]
    assert fake.rules["gpu-health-n1-gpu-0"]["apiVersion"] == "resource.k8s.io/v1beta2"


def test_nothing_without_the_api_or_outside_the_dra_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDRA(None, [slice_of("n1", ("gpu-0", BUS0))])
    fake.install(monkeypatch)
    taints = hd.DeviceTaints(None, lambda: OWNER)  # type: ignore[arg-type]
    for _ in range(2):
        asyncio.run(taints.node("n1", report(sick(BUS0))))
    assert fake.calls == ["discover"] and fake.rules == {}  # looked up once
    fake = FakeDRA("v1", [slice_of("n1", ("gpu-0", BUS0))])
    fake.install(monkeypatch)
    asyncio.run(hd.DeviceTaints(None, lambda: None).node("n1", report(sick(BUS0))))  # type: ignore[arg-type]
    assert fake.calls == []


class Discovery:
    """Kube.served_versions over a fixed discovery: group -> kind -> versions served."""

    def __init__(self, served: dict[str, list[str]]) -> None:
        self.served = served

    async def served_versions(self, group: str, kind: str) -> list[str]:
        assert group == "resource.k8s.io"
        return self.served.get(kind, [])


@pytest.mark.parametrize(
    ("rules", "slices", "expected"),
    [
        (["v1", "v1beta2"], ["v1", "v1beta2"], "v1"),  # 1.37 with the beta API also on: the GA one
        (["v1"], ["v1"], "v1"),  # 1.37's defaults
        (["v1beta2", "v1alpha3"], ["v1", "v1beta2"], "v1beta2"),  # 1.36 with resource.k8s.io/v1beta2 on
        (["v1alpha3"], ["v1"], None),  # only the alpha: not ours
        ([], ["v1"], None),  # 1.36's defaults
        (["v1beta2"], ["v1beta1"], None),  # no v1 ResourceSlice to name the devices
    ],
)
def test_the_newest_served_version_of_device_taint_rule(
    rules: list[str], slices: list[str], expected: str | None
) -> None:
    kube = Discovery({"DeviceTaintRule": rules, "ResourceSlice": slices})
    assert asyncio.run(devicetaints.rule_version(kube)) == expected  # type: ignore[arg-type]


def test_the_health_settings_of_either_stack() -> None:
    from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER
    from gpu_operator.controllers.readmodel import ReadModel
    from gpu_operator.controllers.views import ClusterPolicyView, GPUClusterView

    def cluster(deleting: bool = False) -> GPUClusterView:
        meta: dict[str, Any] = {"name": "gpu-cluster", "uid": "u-1"}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return GPUClusterView.of(
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "GPUCluster",
                "metadata": meta,
                "spec": {"draDriver": {}},
            }
        )

    def policy(spec: dict[str, Any]) -> ClusterPolicyView:
        return ClusterPolicyView.of(
            {
                "apiVersion": "nvidia.com/v1",
                "kind": "ClusterPolicy",
                "metadata": {"name": "p", "uid": "p-1", "creationTimestamp": "t"},
                "spec": spec,
            }
        )

    def model(policies: list[Any], clusters: list[Any]) -> ReadModel:
        m = ReadModel("gpu-operator")
        m.indices = {
            CLUSTER_POLICY.index_id: {v.uid: [v] for v in policies},
            GPU_CLUSTER.index_id: {v.uid: [v] for v in clusters},
        }
        return m

    under_dra = model([], [cluster()])
    spec = under_dra.health_spec()
    assert (
        spec is not None and spec.taintEffect == "NoSchedule" and not spec.remediation.enabled
    )  # the defaults
    assert under_dra.gpucluster_owner() == OWNER
    assert model([], [cluster(deleting=True)]).health_spec() is None
    assert model([], []).health_spec() is None
    both = model([policy({"health": {"taintEffect": "NoExecute"}})], [cluster()])
    assert both.gpucluster_owner() is None  # a ClusterPolicy beside it stops the DRA stack
    spec = both.health_spec()
    assert spec is not None and spec.taintEffect == "NoExecute"
    assert model([policy({"health": {"taintEffect": "Sometimes"}})], []).health_spec() is None  # refused
