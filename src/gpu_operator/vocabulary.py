"""The names that cross layers: label and annotation keys, ownership labels, workload configs,
condition reasons. One definition each; api, render, controllers, node and statusview import them
from here (this module imports nothing of ours).

Upstream's names are a contract: node selectors, dashboards, alerts, k8s-driver-manager and other
operators match on them, so every value below is upstream's unless it says it is ours.
"""

from __future__ import annotations

from typing import Literal, get_args

NVIDIA = "nvidia.com"
NFD = "feature.node.kubernetes.io"
NFD_PREFIX = f"{NFD}/"

# -- node labels -------------------------------------------------------------------------------
GPU_PRESENT = f"{NVIDIA}/gpu.present"
WORKLOAD_CONFIG = f"{NVIDIA}/gpu.workload.config"
DEPLOY_PREFIX = f"{NVIDIA}/gpu.deploy."
DEPLOY_OPERANDS = f"{DEPLOY_PREFIX}operands"
MIG_CAPABLE = f"{NVIDIA}/mig.capable"
MIG_CONFIG = f"{NVIDIA}/mig.config"
GPU_PRODUCT = f"{NVIDIA}/gpu.product"
VGPU_HOST_DRIVER = f"{NVIDIA}/vgpu.host-driver-version"
CC_CAPABLE = f"{NVIDIA}/cc.capable"
DEVICE_PLUGIN_CONFIG = f"{NVIDIA}/device-plugin.config"
KATA_RUNTIME_CLASS = f"{NVIDIA}/kata-runtime-class"
# Published by our probe (ours: upstream has no probe).
DRIVER_SOURCE = f"{NVIDIA}/gpu.driver.source"
DRIVER_VERSION = f"{NVIDIA}/gpu.driver.version"
PROBE_STATUS = f"{NVIDIA}/gpu.probe.status"
# The container-toolkit DaemonSet a GPU node belongs to (ours): its runtime's distribution where it
# is not stock containerd (k3s, k3s-v3, rke2, rke2-v3, microk8s, k0s, crio, docker, talos,
# unrecognised); written by node labelling, selected by the toolkit DaemonSets (docs/distributions.md).
RUNTIME_GROUP = f"{NVIDIA}/gpu.container-runtime"
# VM passthrough (ours). On a mixed node this annotation lists the PCI addresses of the GPUs that
# go to VMs (comma-separated, e.g. "0000:0a:00.0,0000:18:00.0"); the others stay on nvidia for
# containers. Without it, a vm-passthrough node gives every GPU to VMs.
PASSTHROUGH_DEVICES_ANNOTATION = f"{NVIDIA}/gpu.passthrough.devices"
# The probe's published facts (JSON): driver source and, per GPU, address, vendor:device, product
# name and bound driver. The KubeVirt sync reads it.
PROBE_FACTS_ANNOTATION = f"{NVIDIA}/gpu.probe.facts"
# vfio-manage's in-cluster result: a label (bound | partial | refused | failed | none) and an
# annotation (JSON: per GPU, its driver after the run and the refusal or result text).
VFIO_STATE = f"{NVIDIA}/gpu.vfio.state"
VFIO_RESULT_ANNOTATION = f"{NVIDIA}/gpu.vfio.result"
# Event reasons of the node agents that the operator also matches on.
VFIO_BOUND_REASON = "VFIOBound"
VFIO_REFUSED_REASON = "VFIORefused"
HOST_DRIVER_ON_PASSTHROUGH_REASON = "HostDriverOnPassthrough"
# The node agents' field manager (probe, vfio-manage): with the operator's ("gpu-operator", in
# kube/client.py) it tells `gpu-operator cleanup` which node labels and annotations we wrote.
NODE_AGENT_FIELD_MANAGER = "gpu-operator-node"
# NVIDIA's MIG manager (an operand we deploy) writes nvidia.com/mig.config.state and
# nvidia.com/gpu.deploy.nvsm under this field manager (client-go's default: its program's name).
# Cleanup takes those back too: nothing of the MIG manager is left to own them after an uninstall.
MIG_MANAGER_FIELD_MANAGER = "nvidia-mig-manager"
# The operator's KubeVirt sync (ours). Its field manager on the KubeVirt CR, the annotation there that
# lists the pciVendorSelectors it added (KubeVirt's pciHostDevices list is atomic, so ownership of an
# entry is recorded here, not in managedFields), and the ClusterPolicy condition with its reasons.
KUBEVIRT_FIELD_MANAGER = "gpu-operator-kubevirt"
KUBEVIRT_DEVICES_ANNOTATION = f"{NVIDIA}/gpu-operator.permitted-host-devices"
VM_PASSTHROUGH_CONDITION = "VMPassthrough"
HOST_DEVICES_SYNCED = "HostDevicesSynced"
HOST_DEVICES_NOT_SYNCED = "HostDevicesNotSynced"  # sync off or KubeVirt not installed: nothing written
HOST_DEVICE_LISTED_BY_OTHERS = "HostDeviceListedByOthers"
PASSTHROUGH_DEVICE_UNKNOWN = "PassthroughDeviceUnknown"
# a passthrough node whose GPUs the sync could not see: no probe facts from it
PROBE_FACTS_MISSING = "ProbeFactsMissing"
# The NVIDIADriver that owns a GPU node (written by node labelling when NVIDIADrivers are in use).
DRIVER_OWNER = f"{NVIDIA}/gpu-operator.driver.owner"

# GPU feature discovery's labels (upstream GFD v0.20.0, the chart's default: its NodeFeature API is
# on by default, internal/lm/output.go): one NodeFeature (nfd.k8s-sigs.io/v1alpha1) per node, named
# `nvidia-features-for-<node>`, in GFD's pod namespace, labelled with NFD's node-name label, owned by
# the GFD DaemonSet (controller) and the pod; `spec.labels` holds the labels NFD's master would put
# on the Node. Without NFD, the operator's node labelling mirrors them onto the Node (ours) and
# lists the keys it wrote in GFD_LABELS_ANNOTATION, so it removes exactly those.
NODE_FEATURE_GROUP = "nfd.k8s-sigs.io"
NODE_FEATURE_VERSION = "v1alpha1"
NODE_FEATURE_PLURAL = "nodefeatures"
NFD_NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
GFD_NODE_FEATURE_PREFIX = "nvidia-features-for-"
GFD_LABELS_ANNOTATION = f"{NVIDIA}/gpu-operator.gfd.labels"

# NFD labels the renderer reads and the fake node shapes write.
OS_ID = f"{NFD}/system-os_release.ID"
OS_VERSION_ID = f"{NFD}/system-os_release.VERSION_ID"
OS_VERSION_MAJOR = f"{OS_VERSION_ID}.major"
KERNEL_FULL = f"{NFD}/kernel-version.full"
# The extended resource NVIDIA's device plugin registers for full GPUs.
GPU_RESOURCE = f"{NVIDIA}/gpu"
# GPU feature discovery's count label (the shapes write it; upstream's GFD publishes it).
GPU_COUNT = f"{NVIDIA}/gpu.count"
# NFD PCI labels that mark a node with an NVIDIA GPU (vendor 10de).
# A Kubernetes label value (at most 63 characters).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
NFD_GPU_LABELS = (f"{NFD}/pci-10de.present", f"{NFD}/pci-0302_10de.present", f"{NFD}/pci-0300_10de.present")
# NFD's per-model PCI label (deviceLabelFields [vendor, device]): `<prefix><device>.present`, e.g.
# feature.node.kubernetes.io/pci-10de_2330.present; our node discovery writes it for each GPU model.
NFD_DEVICE_LABEL_PREFIX = f"{NFD}/pci-10de_"
# NFD's CPUID label for a VM guest (docs/usage/features.md: HYPERVISOR, "Running under hypervisor");
# our node discovery writes it too, from /proc/cpuinfo's `hypervisor` flag.
NFD_HYPERVISOR = f"{NFD}/cpu-cpuid.HYPERVISOR"
# GPUs whose NVLink goes through NVSwitches on their baseboard (HGX/DGX A100 SXM4, H100 SXM5, H200
# SXM), by PCI device ID: their driver waits for Fabric Manager to bring up the fabric. And the
# NVSwitches (A100's, H100's), which our node discovery labels by device ID like the GPU models.
NVLINK_FABRIC_GPUS = ("20b0", "20b2", "2330", "2335")
NVSWITCH_DEVICES = ("1af1", "22a3")
# The nvidia module parameter that stops the driver from training NVLink (open-gpu-kernel-modules
# kernel-open/nvidia/nv-reg.h, NvLinkDisable: 0 default, 1 disable).
NVLINK_DISABLE_PARAM = "NVreg_NvLinkDisable"


def deploy_label(component: str) -> str:
    """`nvidia.com/gpu.deploy.<component>`: the node label that gates one operand's DaemonSet."""
    return f"{DEPLOY_PREFIX}{component}"


# -- workload configs ---------------------------------------------------------------------------
WorkloadConfig = Literal["container", "vm-passthrough", "vm-vgpu"]
WORKLOAD_CONFIGS: tuple[WorkloadConfig, ...] = get_args(WorkloadConfig)
CONTAINER, VM_PASSTHROUGH, VM_VGPU = WORKLOAD_CONFIGS

# -- driver upgrades (upstream's k8s-operator-libs keys with driver name "gpu") ----------------
UPGRADE_STATE = f"{NVIDIA}/gpu-driver-upgrade-state"
UPGRADE_SKIP = f"{NVIDIA}/gpu-driver-upgrade.skip"
UPGRADE_ENABLED_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-enabled"
UPGRADE_REQUESTED_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-requested"
UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade.driver-wait-for-safe-load"
UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade.node-initial-state.unschedulable"
UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION = (
    f"{NVIDIA}/gpu-driver-upgrade-wait-for-pod-completion-start-time"
)
UPGRADE_VALIDATION_START_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-validation-start-time"
UPGRADE_DRAIN_SKIP_POD_LABEL = f"{NVIDIA}/gpu-driver-upgrade-drain.skip"
# Ours (beyond upstream): why a node failed, since when it is in its state, when pod deletion or
# drain started (their timeouts survive an operator restart), and the pause switch (an annotation
# on the ClusterPolicy or NVIDIADriver whose upgradePolicy applies).
UPGRADE_FAILURE_REASON_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-failure-reason"
UPGRADE_STATE_SINCE_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-state-since"
UPGRADE_POD_DELETION_START_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-pod-deletion-start-time"
UPGRADE_DRAIN_START_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-drain-start-time"
UPGRADE_PAUSED_ANNOTATION = f"{NVIDIA}/gpu-driver-upgrade-paused"
# Every annotation above begins with it.
UPGRADE_ANNOTATION_PREFIX = f"{NVIDIA}/gpu-driver-upgrade"
UPGRADE_EVENT_REASON = "GPUDriverUpgrade"
CONTROLLER_REVISION_HASH = "controller-revision-hash"

# -- GPU health (ours: upstream has no health agent) ---------------------------------------------
# The health agent (our image, on every GPU node) publishes its report per node in this annotation:
# compact JSON, written once per change and never while nothing changes. The operator reads it
# (the only reader) and turns it into HEALTH_CONDITION, HEALTH_TAINT, an Event and metrics.
HEALTH_REPORT_ANNOTATION = f"{NVIDIA}/gpu-health.report"
HEALTH_CONDITION = "NvidiaGPUReady"  # Node condition: True only when validated and every GPU healthy
HEALTH_TAINT = f"{NVIDIA}/gpu-unhealthy"  # NoSchedule (NoExecute if the policy asks) while quarantined
HEALTH_STATE = f"{NVIDIA}/gpu-health.state"  # label: where a node is in remediation
HEALTH_EVENT_REASON = "GPUHealth"
# Remediation (controllers/units/health/machine.py) keeps its memory on the node under this prefix;
# `gpu-operator status` and `health status` read the reason, the time in state and the attempts.
HEALTH_ANNOTATION_PREFIX = f"{NVIDIA}/gpu-health."
HEALTH_REASON_ANNOTATION = f"{HEALTH_ANNOTATION_PREFIX}reason"
HEALTH_SINCE_ANNOTATION = f"{HEALTH_ANNOTATION_PREFIX}since"
HEALTH_ATTEMPTS_ANNOTATION = f"{HEALTH_ANNOTATION_PREFIX}attempts"
# Remediation's requests to the node's health agent (reset these GPUs, reboot the node) live in
# one Secret in the operator's namespace, one data key per node (the node's name), written by the
# operator alone: no operand's Role grants writes to Secrets there, and the agent may only get and
# watch this one by name (docs/health.md, "Who can trigger what"). Each value is compact JSON with
# the keys v, node, action, gpus, remediation, attempt and since; the agent acts only on its own
# node's entry, with remediation on, for the remediation attempt its Node is in (state validating,
# since and attempts as the request says), and answers in its report (`answered`), never by
# writing the request. A Node annotation asks nothing.
HEALTH_REQUESTS_SECRET = "nvidia-gpu-health-requests"
HEALTH_REQUEST_ACTIONS = ("reset-gpu", "reboot")
# The Xid catalogue's resolutions (NVIDIA's "immediate action" buckets), mildest first.
HEALTH_ACTIONS = ("none", "restart-app", "reset-gpu", "reboot")
# The validator components whose status files (<component>-ready) the health agent expects, in
# order (its container's HEALTH_VALIDATIONS); HEALTH_NO_VALIDATIONS: none expected (an empty env
# value would read as unset).
HEALTH_VALIDATIONS = ("driver", "toolkit", "cuda", "plugin")
HEALTH_NO_VALIDATIONS = "none"
# What the validator's workload pods run (its cuda and plugin containers' CUDA_WORKLOAD): NVIDIA's
# CUDA sample vectorAdd from CUDA_VALIDATOR_IMAGE (the default, as NVIDIA's validator), or our CUDA
# driver-API check `gpu-operator node cuda-check` in the validator's own image (no CUDA image).
CUDA_WORKLOAD_ENV = "CUDA_WORKLOAD"
CUDA_WORKLOADS = ("vectorAdd", "driver-api")

# -- MIG changes (NVIDIA's MIG manager writes the state and pauses; self-repair is ours) ------------
# The MIG manager (mig-parted v0.15.0, pkg/mig/reconfigure) writes MIG_CONFIG_STATE (pending,
# success, failed, rebooting) and sets the GPU clients' deploy labels to MIG_PAUSED while it works.
MIG_CONFIG_STATE = f"{MIG_CONFIG}.state"
MIG_PAUSED = "paused-for-mig-change"
MIG_MANAGER_APP = "nvidia-mig-manager"  # its pods' app label (render/states/mig_manager.py)
# The pods it waits for to leave the node before it changes the layout (their app labels).
MIG_CLIENT_APPS = (
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
)
MIG_CONDITION = "NvidiaMIGReady"  # Node condition: True once the selected MIG config is applied
MIG_EVENT_REASON = "MIGChange"
# Reasons of MIG_CONDITION (controllers/units/mig/rules.py decides them).
MIG_APPLIED = "MIGConfigApplied"
MIG_NOT_STARTED = "MIGChangeNotStarted"
MIG_IN_PROGRESS = "MIGChangeInProgress"
MIG_STUCK = "MIGChangeStuck"
MIG_MANAGER_GONE = "MIGManagerGone"
MIG_FAILED = "MIGConfigFailed"
MIG_INVALID_CONFIG = "InvalidMIGConfig"
# On the device plugin's, GFD's and the MPS daemon's pod templates: a hash of the devicePlugin.config
# ConfigMap's content, so an edit of it rolls their pods (config-manager reacts only to the node label)
PLUGIN_CONFIG_HASH = f"{NVIDIA}/gpu-operator.plugin-config-hash"
# The MIG unit's memory on the node: when it first saw the change pending ("<epoch> <mig.config>";
# the MIG manager writes no time), its order to restore the paused deploy labels ("<reason> <why>";
# node labelling carries it out), and its retries ("<attempts> <epoch the next backoff counts from>").
MIG_ANNOTATION_PREFIX = f"{NVIDIA}/gpu-operator.mig."
MIG_PENDING_SINCE = f"{MIG_ANNOTATION_PREFIX}pending-since"
MIG_RESTORE = f"{MIG_ANNOTATION_PREFIX}restore"
MIG_RETRY = f"{MIG_ANNOTATION_PREFIX}retry"

# -- objects the operator owns -------------------------------------------------------------------
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "gpu-operator"
MANAGED_SELECTOR = f"{MANAGED_BY}={MANAGED_BY_VALUE}"
PART_OF = "app.kubernetes.io/part-of"  # in NVIDIA's validator and GFD selectors (render/operand.py)
STATE_LABEL = f"{NVIDIA}/gpu-operator.state"  # ours: which state of the walk rendered an object
HASH_ANNOTATION = f"{NVIDIA}/last-applied-hash"  # ours: hash of what we applied last
# The driver pods carry component=nvidia-driver (upstream's label; the operator watches driver pods by it).
COMPONENT = "app.kubernetes.io/component"
DRIVER_COMPONENT_VALUE = "nvidia-driver"

# -- ClusterPolicy status ------------------------------------------------------------------------
READY, NOT_READY, IGNORED = "ready", "notReady", "ignored"
# Condition reasons (upstream's names: dashboards and alerts match on them).
RECONCILED = "Reconciled"
RECONCILE_FAILED = "ReconcileFailed"
NFD_LABELS_MISSING = "NFDLabelsMissing"
NO_GPU_NODES = "NoGPUNodes"
OPERAND_NOT_READY = "OperandNotReady"
PREREQUISITE_NOT_MET = "PrerequisiteNotMet"
# ours: a GPU node's container runtime is one the toolkit cannot be pointed at (docs/distributions.md);
# also the reason of the Warning Event on that node
RUNTIME_NOT_RECOGNISED = "RuntimeNotRecognised"

# -- the validator's status files ------------------------------------------------------------------
VALIDATIONS_DIR = "/run/nvidia/validations"

# Event reason for a ClusterPolicy field that is set but has no effect (or is unknown)
POLICY_WARNING_REASON = "PolicyWarning"


# The deploy labels of each workload config's operand stack (the node-labelling controller sets
# them; `gpu-operator status` and the simulator read them).
MIG_MANAGER = deploy_label("mig-manager")
VGPU_MANAGER = deploy_label("vgpu-manager")
STATE_LABELS: dict[str, tuple[str, ...]] = {
    "container": tuple(
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
    ),
    "vm-passthrough": tuple(
        deploy_label(c)
        for c in (
            "sandbox-device-plugin",
            "sandbox-validator",
            "vfio-manager",
            "kata-manager",
            "cc-manager",
            "client",
        )
    ),
    "vm-vgpu": tuple(
        deploy_label(c)
        for c in (
            "sandbox-device-plugin",
            "vgpu-manager",
            "vgpu-device-manager",
            "sandbox-validator",
            "cc-manager",
            "client",
        )
    ),
}
KATA_SANDBOX_DEVICE_PLUGIN = deploy_label("kata-sandbox-device-plugin")
# Labels of the DRA stack (GPUCluster) are swept too: a node must not keep a stack it left.
DRA_LABELS = tuple(deploy_label(c) for c in ("dra-driver", "dra-validator", "dcgm-dra", "dcgm-exporter-dra"))
DRA_DRIVER_LABEL = DRA_LABELS[0]
# A GPU node's labels while a GPUCluster is active (the driver label is shared with the
# ClusterPolicy stack: an NVIDIADriver's or the host's driver).
DRA_STATE_LABELS = (deploy_label("driver"), *DRA_LABELS)
ALL_DEPLOY_LABELS = frozenset(
    {label for labels in STATE_LABELS.values() for label in labels}
    | {MIG_MANAGER, KATA_SANDBOX_DEVICE_PLUGIN, *DRA_LABELS}
)


# The driver upgrade states (the value of UPGRADE_STATE), in the order a node goes through them.
UNKNOWN = ""
UPGRADE_REQUIRED = "upgrade-required"
CORDON_REQUIRED = "cordon-required"
WAIT_FOR_JOBS_REQUIRED = "wait-for-jobs-required"
POD_DELETION_REQUIRED = "pod-deletion-required"
DRAIN_REQUIRED = "drain-required"
POD_RESTART_REQUIRED = "pod-restart-required"
VALIDATION_REQUIRED = "validation-required"
UNCORDON_REQUIRED = "uncordon-required"
UPGRADE_DONE = "upgrade-done"
UPGRADE_FAILED = "upgrade-failed"
# Between cordon-required and uncordon-required: what maxParallelUpgrades bounds, and what GPU
# health's remediation waits for before it cordons a node itself.
UPGRADE_ACTIVE = (
    CORDON_REQUIRED,
    WAIT_FOR_JOBS_REQUIRED,
    POD_DELETION_REQUIRED,
    DRAIN_REQUIRED,
    POD_RESTART_REQUIRED,
    VALIDATION_REQUIRED,
    UNCORDON_REQUIRED,
)
