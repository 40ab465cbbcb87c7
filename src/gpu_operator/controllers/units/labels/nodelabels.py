"""Which labels and annotations a node must carry: pure decisions of the node-labelling controller."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.controllers.queries import NodeDriver
from gpu_operator.controllers.units.labels.gfdlabels import applied, gfd_change, gfd_runs

# One rule for "NFD found an NVIDIA GPU", shared with the renderer's cluster facts.
from gpu_operator.render.distributions import PENDING
from gpu_operator.render.facts import has_nfd_gpu_labels as has_gpu
from gpu_operator.render.facts import passthrough_list
from gpu_operator.render.facts import workload_config as _workload_config
from gpu_operator.render.states.mig_manager import mig_capable_devices
from gpu_operator.vocabulary import (
    ALL_DEPLOY_LABELS,
    CONTAINER,
    DEPLOY_OPERANDS,
    DRA_DRIVER_LABEL,
    DRA_STATE_LABELS,
    DRIVER_OWNER,
    GPU_PRESENT,
    KATA_SANDBOX_DEVICE_PLUGIN,
    MIG_CAPABLE,
    MIG_CONFIG,
    MIG_MANAGER,
    MIG_PAUSED,
    MIG_RESTORE,
    NFD_DEVICE_LABEL_PREFIX,
    RUNTIME_GROUP,
    STATE_LABELS,
    UNKNOWN,
    UPGRADE_DONE,
    UPGRADE_ENABLED_ANNOTATION,
    UPGRADE_REQUIRED,
    UPGRADE_STATE,
    VGPU_HOST_DRIVER,
    VGPU_MANAGER,
    VM_PASSTHROUGH,
    deploy_label,
)


@dataclass(frozen=True)
class LabelPolicy:
    """The few ClusterPolicy facts that decide node labels."""

    sandbox_enabled: bool = False
    default_workload: str = "container"
    sandbox_mode: str = "kubevirt"
    mig_manager_enabled: bool = True
    mig_config_default: str | None = "all-disabled"
    driver_auto_upgrade: bool = False  # ClusterPolicySpec.driver_auto_upgrade()
    use_nvidia_driver_crd: bool = False  # NVIDIADrivers own the driver: owner labels, per-CR upgrades
    # A GPUCluster is active (not a ClusterPolicy): GPU nodes get the DRA stack's labels.
    dra: bool = False
    # Nodes where a pod still holds a gpu.nvidia.com ResourceClaim: the DRA driver label stays.
    claim_holders: frozenset[str] = frozenset()
    # The operator puts GFD's NodeFeature labels on nodes (OperatorSettings.gfd_node_labels: no NFD
    # in the cluster); False: it neither writes nor removes any of them (controllers/units/labels/gfdlabels.py).
    gfd_mirror: bool = False
    gfd_enabled: bool = True  # the ClusterPolicy deploys GFD (spec.gfd.enabled)

    @classmethod
    def of(cls, spec: ClusterPolicySpec) -> LabelPolicy:
        """From a validated spec: every default and rule is the api model's (api/clusterpolicy.py),
        the same the renderer reads, so labels and rendered objects cannot disagree."""
        mig_config = spec.migManager.config
        return cls(
            sandbox_enabled=spec.sandbox_on(),
            default_workload=spec.default_workload(),
            sandbox_mode=spec.sandbox_mode(),
            mig_manager_enabled=spec.migManager.on(),
            mig_config_default=mig_config.default if mig_config is not None else None,
            driver_auto_upgrade=spec.driver_auto_upgrade(),
            use_nvidia_driver_crd=bool(spec.driver.useNvidiaDriverCRD),
            gfd_enabled=spec.gfd.on(),
        )


@dataclass(frozen=True)
class NodeChange:
    """Label and annotation changes for one node; None removes the key."""

    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.labels or self.annotations)

    def merge_patch(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"metadata": metadata}


def mig_capable(labels: Mapping[str, str]) -> bool:
    """GFD's `nvidia.com/mig.capable` where GFD has run; before that (or where GFD cannot run) a GPU
    model our MIG layouts list, by the PCI device IDs NFD or our discovery label the node with."""
    if labels.get(VGPU_HOST_DRIVER):
        return False
    if MIG_CAPABLE in labels:
        return labels[MIG_CAPABLE] == "true"
    capable = mig_capable_devices()
    return any(
        key.startswith(NFD_DEVICE_LABEL_PREFIX)
        and value == "true"
        and key[len(NFD_DEVICE_LABEL_PREFIX) :].removesuffix(".present") in capable
        for key, value in labels.items()
    )


def workload_config(labels: dict[str, str], policy: LabelPolicy) -> str:
    return _workload_config(labels, policy.sandbox_enabled, policy.default_workload)


def is_mixed(annotations: dict[str, str], policy: LabelPolicy) -> bool:
    """A mixed node (ours): sandbox workloads on and the node lists its passthrough GPUs in
    `nvidia.com/gpu.passthrough.devices`; it runs the container stack and the vm-passthrough stack."""
    return policy.sandbox_enabled and passthrough_list(annotations) is not None


def _state_labels(config: str, policy: LabelPolicy) -> tuple[str, ...]:
    labels = STATE_LABELS[config]
    if config == "vm-passthrough" and policy.sandbox_mode == "kata":
        return tuple(
            KATA_SANDBOX_DEVICE_PLUGIN if lbl == deploy_label("sandbox-device-plugin") else lbl
            for lbl in labels
        )
    return labels


def _driver_owner(
    labels: dict[str, str],
    annotations: dict[str, str],
    driver: NodeDriver,
    change_labels: dict[str, str | None],
    change_annotations: dict[str, str | None],
) -> None:
    """Owner label, upgrade-enabled annotation per owner, and the migration rule: a node whose
    driver pod was orphaned by the switch to NVIDIADrivers is marked upgrade-required, so the
    upgrade controller replaces that pod with the owner's (when the owner's autoUpgrade is on)."""
    if driver.conflict:
        return
    if driver.owner is None:
        if DRIVER_OWNER in labels:
            change_labels[DRIVER_OWNER] = None
        if UPGRADE_ENABLED_ANNOTATION in annotations:
            change_annotations[UPGRADE_ENABLED_ANNOTATION] = None
        return
    if labels.get(DRIVER_OWNER) != driver.owner:
        change_labels[DRIVER_OWNER] = driver.owner
    if driver.auto_upgrade:
        if annotations.get(UPGRADE_ENABLED_ANNOTATION) != "true":
            change_annotations[UPGRADE_ENABLED_ANNOTATION] = "true"
    elif UPGRADE_ENABLED_ANNOTATION in annotations:
        change_annotations[UPGRADE_ENABLED_ANNOTATION] = None
    if (
        driver.auto_upgrade
        and driver.orphaned_driver_pod
        and labels.get(UPGRADE_STATE, "") in (UNKNOWN, UPGRADE_DONE)
    ):
        # (with autoUpgrade off the upgrade controller removes state labels: no label fight)
        change_labels[UPGRADE_STATE] = UPGRADE_REQUIRED


def _dra_change(labels: dict[str, str], present: set[str], change_labels: dict[str, str | None]) -> None:
    """A GPU node of the DRA stack: its labels set (a non-empty value kept: the driver manager pauses
    an operand by rewriting it), every other stack's label removed but the vGPU manager's.
    `nvidia.com/gpu.deploy.operands=false` does not apply to this stack (as upstream)."""
    for key in DRA_STATE_LABELS:
        if not labels.get(key):
            change_labels[key] = "true"
    for key in present - set(DRA_STATE_LABELS) - {VGPU_MANAGER}:
        change_labels[key] = None


def desired_change(
    labels: dict[str, str],
    annotations: dict[str, str],
    policy: LabelPolicy,
    driver: NodeDriver | None = None,
    node: str = "",
    gfd: Mapping[str, str] | None = None,
    runtime_group: str = "",
) -> NodeChange:
    """What must change on a node with these labels and annotations; empty when nothing. `gfd`:
    the labels GPU feature discovery publishes for the node (its NodeFeature), None if none.

    With the GFD mirror on, GFD's labels are decided first and the stack's labels from the node as
    it will be (GFD's mig.capable decides the MIG manager in the same patch); GFD's labels are kept
    only while the node's own GFD deploy label says GFD runs there.
    """
    change = _desired_change(labels, annotations, policy, driver, node, gfd)
    _runtime_group(labels, change.labels, runtime_group)
    return change


def _runtime_group(labels: dict[str, str], change_labels: dict[str, str | None], group: str) -> None:
    """A GPU node's container-toolkit group (render/distributions.py) where it is not stock
    containerd: the toolkit DaemonSets select on it (docs/distributions.md). While the kubelet has not
    reported the node's runtime (PENDING) the label is left as it is: decided when the runtime appears."""
    if group == PENDING:
        return
    gpu = applied(labels, change_labels).get(GPU_PRESENT) == "true"
    wanted = group if gpu and group and group != "containerd" else None
    if labels.get(RUNTIME_GROUP) != wanted:
        change_labels[RUNTIME_GROUP] = wanted


def _desired_change(
    labels: dict[str, str],
    annotations: dict[str, str],
    policy: LabelPolicy,
    driver: NodeDriver | None,
    node: str,
    gfd: Mapping[str, str] | None,
) -> NodeChange:
    if not policy.gfd_mirror:
        return _stack_change(labels, annotations, policy, driver, node)
    published = gfd if policy.gfd_enabled else None
    mirror = gfd_change(labels, annotations, published)
    stack = _stack_change(applied(labels, mirror.labels), annotations, policy, driver, node)
    if published is not None and not gfd_runs(applied(applied(labels, mirror.labels), stack.labels)):
        mirror = gfd_change(labels, annotations, None)
        stack = _stack_change(applied(labels, mirror.labels), annotations, policy, driver, node)
    return NodeChange({**mirror.labels, **stack.labels}, {**mirror.annotations, **stack.annotations})


def _stack_change(
    labels: dict[str, str],
    annotations: dict[str, str],
    policy: LabelPolicy,
    driver: NodeDriver | None = None,
    node: str = "",
) -> NodeChange:
    """The stack's labels (presence, deploy labels, MIG config, driver owner and upgrades).

    Never overwrites a non-empty deploy label: k8s-driver-manager and users write values such as
    `false`, `pre-installed` or `paused-for-driver-upgrade` that must survive, and the MIG manager
    pauses GPU clients with `paused-for-mig-change` while it changes the layout. The one exception:
    a node the MIG unit found stuck in a MIG change (its restore order, controllers/units/mig/rules.py)
    gets its `paused-for-mig-change` labels back to `true`, so its GPU clients come back.
    """
    change_labels: dict[str, str | None] = {}
    change_annotations: dict[str, str | None] = {}
    gpu = has_gpu(labels)

    if gpu and labels.get(GPU_PRESENT) != "true":
        change_labels[GPU_PRESENT] = "true"
    elif not gpu and labels.get(GPU_PRESENT) == "true":
        change_labels[GPU_PRESENT] = "false"

    present = {key for key in ALL_DEPLOY_LABELS if key in labels}
    if DRIVER_OWNER in labels and (not gpu or not policy.use_nvidia_driver_crd):
        change_labels[DRIVER_OWNER] = None  # no NVIDIADriver in charge of this node
    if policy.dra and gpu:
        _dra_change(labels, present, change_labels)
        # no ClusterPolicy upgrades this driver: only NVIDIADrivers, when there are any
        _driver_upgrades(labels, annotations, policy, driver, False, change_labels, change_annotations)
        return NodeChange(change_labels, change_annotations)
    if node in policy.claim_holders:
        present.discard(DRA_DRIVER_LABEL)  # removed once the node's pods release their claims
    if not gpu or labels.get(DEPLOY_OPERANDS) == "false":
        change_labels.update({key: None for key in present})
        return NodeChange(change_labels, change_annotations)

    config = workload_config(labels, policy)
    mixed = is_mixed(annotations, policy)
    wanted = set(_state_labels(config, policy))
    if mixed:
        # Both stacks, whatever the workload label says: the listed GPUs go to vfio-pci (vfio-manage
        # binds only those), the others stay on nvidia for the device plugin. No MIG manager is added:
        # it would repartition GPUs across the split.
        wanted = set(_state_labels(CONTAINER, policy)) | set(_state_labels(VM_PASSTHROUGH, policy))
    capable = mig_capable(labels)
    if config == "container" and not mixed and (capable or MIG_MANAGER in labels):
        wanted.add(MIG_MANAGER)  # never removed from a container node once set
    restore = MIG_RESTORE in annotations  # the MIG unit's restore order (units/mig/rules.py)
    for key in wanted:
        value = labels.get(key)
        if not value or (restore and value == MIG_PAUSED):
            change_labels[key] = "true"
    for key in present - wanted:
        change_labels[key] = None

    if (
        policy.mig_manager_enabled
        and capable
        and not labels.get(MIG_CONFIG)
        and policy.mig_config_default == "all-disabled"
    ):
        change_labels[MIG_CONFIG] = "all-disabled"

    _driver_upgrades(
        labels, annotations, policy, driver, policy.driver_auto_upgrade, change_labels, change_annotations
    )
    return NodeChange(change_labels, change_annotations)


def _driver_upgrades(
    labels: dict[str, str],
    annotations: dict[str, str],
    policy: LabelPolicy,
    driver: NodeDriver | None,
    auto_upgrade: bool,
    change_labels: dict[str, str | None],
    change_annotations: dict[str, str | None],
) -> None:
    """Who upgrades the node's driver: NVIDIADrivers (owner label, their upgrade switch) when they
    own it, else the ClusterPolicy's autoUpgrade (`auto_upgrade`); a switch nobody sets goes."""
    if policy.use_nvidia_driver_crd:
        _driver_owner(labels, annotations, driver or NodeDriver(), change_labels, change_annotations)
    elif auto_upgrade:
        if annotations.get(UPGRADE_ENABLED_ANNOTATION) != "true":
            change_annotations[UPGRADE_ENABLED_ANNOTATION] = "true"
    elif UPGRADE_ENABLED_ANNOTATION in annotations:
        change_annotations[UPGRADE_ENABLED_ANNOTATION] = None
