"""Table tests of the node-labelling decisions (upstream-contract section 4)."""

from __future__ import annotations

import pytest

from gpu_operator.controllers.units.labels.nodelabels import (
    LabelPolicy,
    desired_change,
    mig_capable,
    workload_config,
)
from gpu_operator.vocabulary import MIG_CONFIG, MIG_MANAGER, UPGRADE_ENABLED_ANNOTATION, deploy_label
from tests.unit.controllers.labelkit import label_policy, policy_of

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
CONTAINER = {
    deploy_label(c)
    for c in (
        "driver",
        "gpu-feature-discovery",
        "container-toolkit",
        "device-plugin",
        "dcgm",
        "dcgm-exporter",
        "node-status-exporter",
        "operator-validator",
        "client",
    )
}
SANDBOX = LabelPolicy(sandbox_enabled=True, default_workload="vm-passthrough")


def set_to_true(change: dict[str, str | None]) -> set[str]:
    return {k for k, v in change.items() if v == "true"}


def test_fresh_gpu_node_gets_present_and_container_stack() -> None:
    change = desired_change(dict(GPU), {}, LabelPolicy())
    assert change.labels["nvidia.com/gpu.present"] == "true"
    assert set_to_true(change.labels) == CONTAINER | {"nvidia.com/gpu.present"}


def test_node_already_labelled_needs_no_change() -> None:
    labels = {**GPU, "nvidia.com/gpu.present": "true", **{k: "true" for k in CONTAINER}}
    assert not desired_change(labels, {}, LabelPolicy())


@pytest.mark.parametrize(
    "value",
    ["false", "pre-installed", "paused-for-driver-upgrade", "pre-installed_paused-for-driver-upgrade"],
)
def test_non_empty_values_survive(value: str) -> None:
    labels = {**GPU, deploy_label("driver"): value}
    change = desired_change(labels, {}, LabelPolicy())
    assert deploy_label("driver") not in change.labels


def test_empty_value_counts_as_absent() -> None:
    change = desired_change({**GPU, deploy_label("driver"): ""}, {}, LabelPolicy())
    assert change.labels[deploy_label("driver")] == "true"


def test_operands_opt_out_strips_every_deploy_label() -> None:
    labels = {
        **GPU,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.operands": "false",
        deploy_label("driver"): "true",
        MIG_MANAGER: "true",
        deploy_label("vfio-manager"): "true",
    }
    change = desired_change(labels, {}, LabelPolicy())
    assert change.labels == {
        deploy_label("driver"): None,
        MIG_MANAGER: None,
        deploy_label("vfio-manager"): None,
    }


def test_gpu_gone_flips_present_and_strips_labels() -> None:
    labels = {"nvidia.com/gpu.present": "true", deploy_label("driver"): "true", MIG_CONFIG: "all-disabled"}
    change = desired_change(labels, {}, LabelPolicy())
    assert change.labels == {"nvidia.com/gpu.present": "false", deploy_label("driver"): None}


def test_cpu_node_is_left_alone() -> None:
    assert not desired_change({"kubernetes.io/os": "linux"}, {}, LabelPolicy())


@pytest.mark.parametrize(
    ("labels", "policy", "expected"),
    [
        ({}, LabelPolicy(), "container"),
        ({"nvidia.com/gpu.workload.config": "vm-vgpu"}, LabelPolicy(), "container"),  # sandbox off
        ({}, SANDBOX, "vm-passthrough"),
        ({"nvidia.com/gpu.workload.config": "vm-vgpu"}, SANDBOX, "vm-vgpu"),
        ({"nvidia.com/gpu.workload.config": "bogus"}, SANDBOX, "vm-passthrough"),
        ({}, LabelPolicy(sandbox_enabled=True, default_workload="bogus"), "container"),
    ],
)
def test_workload_config(labels: dict[str, str], policy: LabelPolicy, expected: str) -> None:
    assert workload_config(labels, policy) == expected


def test_switching_to_passthrough_swaps_stacks() -> None:
    labels = {**GPU, "nvidia.com/gpu.present": "true", **{k: "true" for k in CONTAINER}}
    change = desired_change(labels, {}, SANDBOX)
    assert set_to_true(change.labels) == {
        deploy_label(c)
        for c in ("sandbox-device-plugin", "sandbox-validator", "vfio-manager", "kata-manager", "cc-manager")
    }
    assert {k for k, v in change.labels.items() if v is None} == CONTAINER - {deploy_label("client")}


def test_kata_mode_uses_kata_sandbox_device_plugin() -> None:
    policy = LabelPolicy(sandbox_enabled=True, default_workload="vm-passthrough", sandbox_mode="kata")
    labels = set_to_true(desired_change(dict(GPU), {}, policy).labels)
    assert (
        deploy_label("kata-sandbox-device-plugin") in labels
        and deploy_label("sandbox-device-plugin") not in labels
    )


def dev(device: str) -> dict[str, str]:
    """NFD's per-model PCI label (deviceLabelFields [vendor, device]), as our discovery writes it."""
    return {f"feature.node.kubernetes.io/pci-10de_{device}.present": "true"}


@pytest.mark.parametrize(
    ("labels", "capable"),
    [
        ({"nvidia.com/mig.capable": "true"}, True),
        ({"nvidia.com/mig.capable": "false", **dev("2330")}, False),  # GFD's word wins
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, False),  # no product-name guess
        ({"nvidia.com/gpu.product": "NVIDIA-L40S"}, False),
        ({**dev("2330"), "nvidia.com/vgpu.host-driver-version": "550"}, False),
        (dev("2236"), False),  # A10
        (dev("26b9"), False),  # L40S
        ({**dev("26b9"), **dev("2330")}, True),  # one MIG-capable model is enough
        ({"feature.node.kubernetes.io/pci-10de_2330.present": "false"}, False),
    ],
)
def test_mig_capable(labels: dict[str, str], capable: bool) -> None:
    assert mig_capable(labels) is capable


# Device IDs of every MIG-capable model our MIG layouts list (mig-layouts.txt), by name.
@pytest.mark.parametrize(
    ("model", "device"),
    [
        ("A30", "20b7"),
        ("A100 SXM4 40GB", "20b0"),
        ("A100 SXM4 80GB", "20b2"),
        ("A100 PCIe 80GB", "20b5"),
        ("H100 SXM5", "2330"),
        ("H100 PCIe", "2331"),
        ("H100 NVL", "2321"),
        ("H200 SXM", "2335"),
        ("GH200", "2342"),
        ("B200", "2901"),
        ("GB200", "2941"),
    ],
)
def test_every_mig_capable_model_is_known_by_its_device_id(model: str, device: str) -> None:
    assert mig_capable({**GPU, **dev(device)}), model


def test_mig_manager_and_default_mig_config() -> None:
    labels = {**GPU, "nvidia.com/mig.capable": "true"}
    change = desired_change(labels, {}, LabelPolicy(mig_config_default="all-disabled"))
    assert change.labels[MIG_MANAGER] == "true"
    assert change.labels[MIG_CONFIG] == "all-disabled"
    assert MIG_CONFIG not in desired_change(labels, {}, LabelPolicy(mig_config_default=None)).labels
    assert MIG_CONFIG not in desired_change(labels, {}, LabelPolicy(mig_manager_enabled=False)).labels


def test_mig_manager_label_is_kept_on_container_nodes_once_set() -> None:
    labels = {**GPU, MIG_MANAGER: "true", "nvidia.com/mig.capable": "false"}
    assert MIG_MANAGER not in desired_change(labels, {}, LabelPolicy()).labels


def test_upgrade_annotation_follows_policy() -> None:
    on = LabelPolicy(driver_auto_upgrade=True)
    assert desired_change(dict(GPU), {}, on).annotations == {UPGRADE_ENABLED_ANNOTATION: "true"}
    assert desired_change(dict(GPU), {UPGRADE_ENABLED_ANNOTATION: "true"}, LabelPolicy()).annotations == {
        UPGRADE_ENABLED_ANNOTATION: None
    }


def test_label_policy_of_a_stored_spec_defaults_and_values() -> None:
    assert policy_of({}) == LabelPolicy(mig_config_default=None)
    assert policy_of({"sandboxWorkloads": {"mode": "firecracker"}}) is None  # the model rejects it
    spec = {
        "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu", "mode": "kata"},
        "migManager": {"enabled": False, "config": {"default": "all-disabled"}},
        "driver": {"upgradePolicy": {"autoUpgrade": True}},
    }
    policy = policy_of(spec)
    assert policy == LabelPolicy(
        sandbox_enabled=True,
        default_workload="vm-vgpu",
        sandbox_mode="kata",
        mig_manager_enabled=False,
        mig_config_default="all-disabled",
        driver_auto_upgrade=False,
    )  # sandbox turns auto-upgrade off
    assert label_policy({"driver": {"upgradePolicy": {"autoUpgrade": True}}}).driver_auto_upgrade


def test_merge_patch_shape() -> None:
    change = desired_change(dict(GPU), {}, LabelPolicy(driver_auto_upgrade=True))
    patch = change.merge_patch()
    assert patch["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert patch["metadata"]["annotations"] == {UPGRADE_ENABLED_ANNOTATION: "true"}


# -- mixed nodes (ours): the passthrough list annotation puts both stacks on the node ------------------
PASSTHROUGH_STACK = {
    deploy_label(c)
    for c in (
        "sandbox-device-plugin",
        "sandbox-validator",
        "vfio-manager",
        "kata-manager",
        "cc-manager",
        "client",
    )
}
MIXED = {"nvidia.com/gpu.passthrough.devices": "0000:0a:00.0,18:00.0"}
H100 = {**GPU, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize("workload", ["vm-passthrough", "container", None])
def test_mixed_node_gets_both_stacks_whatever_its_workload_label(workload: str | None) -> None:
    labels = {**H100, **({"nvidia.com/gpu.workload.config": workload} if workload else {})}
    change = desired_change(labels, dict(MIXED), SANDBOX)
    assert set_to_true(change.labels) == CONTAINER | PASSTHROUGH_STACK | {"nvidia.com/gpu.present"}
    assert MIG_MANAGER not in change.labels  # no MIG repartitioning across the split


def test_mixed_annotation_is_ignored_without_sandbox_workloads() -> None:
    change = desired_change(dict(H100), dict(MIXED), LabelPolicy())
    assert not set_to_true(change.labels) & (PASSTHROUGH_STACK - CONTAINER)


def test_passthrough_node_loses_container_stack_when_annotation_goes() -> None:
    labels = {**GPU, "nvidia.com/gpu.present": "true", **{k: "true" for k in CONTAINER | PASSTHROUGH_STACK}}
    assert not desired_change(labels, dict(MIXED), SANDBOX)
    change = desired_change(labels, {}, SANDBOX)
    assert {k for k, v in change.labels.items() if v is None} == CONTAINER - PASSTHROUGH_STACK


PAUSABLE = [deploy_label(c) for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm")]


def _paused_node() -> dict[str, str]:
    labels = {
        **GPU,
        "nvidia.com/gpu.present": "true",
        **{k: "true" for k in CONTAINER},
        MIG_MANAGER: "true",
        MIG_CONFIG: "all-1g.10gb",
        "nvidia.com/mig.config.state": "pending",
    }
    labels.update({k: "paused-for-mig-change" for k in PAUSABLE})
    labels[deploy_label("dcgm")] = "false"  # a client the user turned off: the MIG manager keeps it false
    return labels


def test_paused_for_mig_change_is_kept_while_the_mig_manager_works() -> None:
    assert not desired_change(_paused_node(), {}, LabelPolicy())


def test_a_node_stuck_in_a_mig_change_gets_its_paused_labels_back() -> None:
    restore = {"nvidia.com/gpu-operator.mig.restore": "MIGChangeStuck why"}
    change = desired_change(_paused_node(), restore, LabelPolicy())
    # only the paused deploy labels, to true; the user's false stays, the MIG labels are not ours to touch
    assert change.labels == {k: "true" for k in PAUSABLE if k != deploy_label("dcgm")}
    assert change.annotations == {}
    # once restored, nothing more to write
    restored = {**_paused_node(), **{k: v for k, v in change.labels.items() if v is not None}}
    assert not desired_change(restored, restore, LabelPolicy())
