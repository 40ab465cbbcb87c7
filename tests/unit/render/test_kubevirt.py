"""Table tests of the KubeVirt permitted-host-devices rules (render/kubevirt.py): which GPUs count,
the names in both conventions, the merge that keeps others' entries, the findings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render import kubevirt as kv
from gpu_operator.vocabulary import (
    HOST_DEVICE_LISTED_BY_OTHERS,
    HOST_DRIVER_ON_PASSTHROUGH_REASON,
    KUBEVIRT_DEVICES_ANNOTATION,
    PASSTHROUGH_DEVICE_UNKNOWN,
    PROBE_FACTS_ANNOTATION,
)

SEED_001 = ["0a", "18", "3b", "44", "87", "90", "b8", "c1"]
H100_NAME = "GH100 [H100 SXM5 80GB]"


def facts(driver: str | dict[str, str], buses: list[str] = SEED_001) -> dict[str, str]:
    drivers = driver if isinstance(driver, dict) else {b: driver for b in buses}
    gpus = [
        {
            "address": f"0000:{b}:00.0",
            "vendorDevice": "10de:2330",
            "name": H100_NAME,
            "product": "H100 SXM5 80GB",
            "driver": drivers.get(b, ""),
        }
        for b in buses
    ]
    return {PROBE_FACTS_ANNOTATION: json.dumps({"driverSource": "none", "gpus": gpus})}


def node(name: str, annotations: dict[str, str], workload: str | None = "vm-passthrough") -> kv.NodeInput:
    labels = {"nvidia.com/gpu.workload.config": workload} if workload else {}
    return kv.NodeInput(name, labels, annotations)


def spec(**extra: Any) -> ClusterPolicySpec:
    return ClusterPolicySpec.model_validate(
        {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "container"}, **extra}
    )


def test_two_passthrough_nodes_give_one_entry_named_as_seed_001() -> None:
    inv = kv.inventory([node("a", facts("vfio-pci")), node("b", facts("vfio-pci"))], spec())
    assert len(inv.bound) == 16 and not inv.findings
    assert kv.desired_entries(inv.bound, external=False) == [
        {
            "pciVendorSelector": "10DE:2330",
            "resourceName": "nvidia.com/H100_SXM5_80GB",
            "externalResourceProvider": False,
        }
    ]


def test_sandbox_plugin_naming_is_the_whole_pci_ids_name() -> None:
    inv = kv.inventory([node("a", facts("vfio-pci"))], spec())
    assert (
        kv.desired_entries(inv.bound, external=True)[0]["resourceName"] == "nvidia.com/GH100_H100_SXM5_80GB"
    )


@pytest.mark.parametrize(
    ("name", "external", "want"),
    [
        ("GH100 [H100 SXM5 80GB]", False, "H100_SXM5_80GB"),
        ("GH100 [H200 SXM 141GB]", True, "GH100_H200_SXM_141GB"),
        ("GA100 [A100 PCIe 40GB]", False, "A100_PCIE_40GB"),
        ("TU104GL [Tesla T4]", True, "TU104GL_TESLA_T4"),
        ("GV100GL [Tesla V100S PCIe 32GB]", False, "TESLA_V100S_PCIE_32GB"),
        ("AD102GL [L40S]", True, "AD102GL_L40S"),
    ],
)
def test_resource_names(name: str, external: bool, want: str) -> None:
    product = name[name.index("[") + 1 : name.index("]")]
    gpu = kv.VmGpu("n", "0000:0a:00.0", "10DE:1234", product, name)
    assert kv.resource_name(gpu, external) == f"nvidia.com/{want}"


def test_nodes_not_for_vms_and_unbound_gpus_do_not_count() -> None:
    nodes = [
        node("container", facts("nvidia"), workload="container"),
        node("fresh", facts("")),
        node("nofacts", {}),
    ]
    inv = kv.inventory(nodes, spec())
    assert not inv.bound and not inv.findings
    assert inv.no_facts == ["nofacts"] and len(inv.pending) == 8


def test_default_workload_applies_to_unlabelled_nodes() -> None:
    inv = kv.inventory(
        [node("a", facts("vfio-pci"), workload=None)],
        spec(sandboxWorkloads={"enabled": True, "defaultWorkload": "vm-passthrough"}),
    )
    assert len(inv.bound) == 8


def test_nothing_when_sandbox_workloads_are_off() -> None:
    inv = kv.inventory([node("a", facts("vfio-pci"))], ClusterPolicySpec())
    assert not inv.bound


def test_host_driver_on_passthrough_is_a_finding_per_gpu() -> None:
    inv = kv.inventory([node("a", facts({"0a": "nvidia", "18": "vfio-pci"}, ["0a", "18"]))], spec())
    assert [g.address for g in inv.bound] == ["0000:18:00.0"]
    assert [(f.reason, f.node) for f in inv.findings] == [(HOST_DRIVER_ON_PASSTHROUGH_REASON, "a")]
    assert "0000:0a:00.0" in inv.findings[0].message and "vfio-manage bind" in inv.findings[0].message


def test_mixed_node_counts_only_its_listed_gpus() -> None:
    drivers = {b: ("vfio-pci" if b in SEED_001[:4] else "nvidia") for b in SEED_001}
    annotations = {
        **facts(drivers),
        "nvidia.com/gpu.passthrough.devices": "0a:00.0, 18:00.0,3B:00.0 0000:44:00.0",
    }
    inv = kv.inventory([node("mixed", annotations, workload="container")], spec())
    assert sorted(g.address for g in inv.bound) == [f"0000:{b}:00.0" for b in SEED_001[:4]]
    assert not inv.findings  # the nvidia ones are the containers' half


def test_mixed_node_listing_an_absent_gpu_is_a_finding() -> None:
    annotations = {**facts("vfio-pci"), "nvidia.com/gpu.passthrough.devices": "0000:0a:00.0,0000:ff:00.0"}
    inv = kv.inventory([node("mixed", annotations)], spec())
    assert [f.reason for f in inv.findings] == [PASSTHROUGH_DEVICE_UNKNOWN]


def cr(entries: list[dict[str, Any]], ours: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "kubevirt", "namespace": "cozy-kubevirt", "resourceVersion": "7"}
    if ours is not None:
        meta["annotations"] = {KUBEVIRT_DEVICES_ANNOTATION: ours}
    return {
        "metadata": meta,
        "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": entries}}},
    }


H100 = {
    "pciVendorSelector": "10DE:2330",
    "resourceName": "nvidia.com/H100_SXM5_80GB",
    "externalResourceProvider": False,
}
USER = {"pciVendorSelector": "8086:107C", "resourceName": "kubevirt.io/internet-card"}


def test_merge_keeps_others_entries_and_records_ours() -> None:
    merged = kv.merge(cr([USER]), [H100])
    assert merged.entries == [USER, H100] and merged.ours == ["10DE:2330"] and merged.changed
    body = kv.apply_body(cr([USER]), merged)
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["metadata"]["annotations"] == {KUBEVIRT_DEVICES_ANNOTATION: "10DE:2330"}


def test_merge_is_stable_and_withdraws_ours_only() -> None:
    assert not kv.merge(cr([USER, H100], "10DE:2330"), [H100]).changed
    withdrawn = kv.merge(cr([USER, H100], "10DE:2330"), [])
    assert withdrawn.entries == [USER] and withdrawn.ours == [] and withdrawn.changed


def test_flipping_the_provider_replaces_our_entry() -> None:
    external = {**H100, "resourceName": "nvidia.com/GH100_H100_SXM5_80GB", "externalResourceProvider": True}
    merged = kv.merge(cr([USER, H100], "10DE:2330"), [external])
    assert merged.entries == [USER, external] and not merged.findings


def test_a_selector_someone_else_lists_differently_is_reported_not_overwritten() -> None:
    theirs = {**H100, "externalResourceProvider": True, "resourceName": "nvidia.com/GH100_H100_SXM5_80GB"}
    merged = kv.merge(cr([theirs]), [H100])
    assert merged.entries == [theirs] and merged.ours == [] and not merged.changed
    assert [f.reason for f in merged.findings] == [HOST_DEVICE_LISTED_BY_OTHERS]
    assert (
        "10DE:2330" in merged.findings[0].message
        and "KubeVirt cozy-kubevirt/kubevirt" in merged.findings[0].message
    )


def test_a_selector_listed_exactly_as_we_would_is_left_to_its_owner() -> None:
    merged = kv.merge(cr([H100]), [H100])
    assert merged.entries == [H100] and merged.ours == [] and not merged.findings and not merged.changed


def test_condition() -> None:
    inv = kv.inventory([node("a", facts("vfio-pci")), node("b", facts("vfio-pci"))], spec())
    entries = kv.desired_entries(inv.bound, external=False)
    ok = kv.condition([], True, kv.summary(inv, entries))
    assert ok["status"] == "True" and ok["reason"] == "HostDevicesSynced"
    assert "10DE:2330 nvidia.com/H100_SXM5_80GB: 16 GPU(s) on vfio-pci on 2 node(s)" in ok["message"]
    bad = kv.condition([kv.KubeVirtFinding(HOST_DRIVER_ON_PASSTHROUGH_REASON, "x", "a")], True, "")
    assert bad["status"] == "False" and bad["reason"] == HOST_DRIVER_ON_PASSTHROUGH_REASON


def test_messages_stay_short_on_many_nodes() -> None:
    nodes = [node(f"n{i:03}", facts("")) for i in range(40)] + [node(f"x{i:03}", {}) for i in range(40)]
    inv = kv.inventory(nodes, spec())
    text = kv.summary(inv, [])
    assert "and 312 more" in text and "and 32 more" in text and len(text) < 1000
    findings = [kv.KubeVirtFinding(HOST_DRIVER_ON_PASSTHROUGH_REASON, f"m{i}", "a") for i in range(9)]
    assert kv.condition(findings, True, "")["message"].endswith(
        "and 4 more finding(s): see the Warning Events"
    )
