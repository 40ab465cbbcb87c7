"""NVLink in VM guests (pure): which nodes need the nvidia module's NVreg_NvLinkDisable=1, and the
kernel-module ConfigMap their driver DaemonSet reads instead of the user's (the user's, merged).

A GPU whose NVLink runs through NVSwitches (HGX A100/H100/H200 SXM), passed into a VM without those
NVSwitches, waits for a fabric that no Fabric Manager brings up for the VM, and CUDA fails to start
(cuInit: CUDA_ERROR_SYSTEM_NOT_READY) unless the driver is loaded with NVLink disabled. NVIDIA's
driver container reads one parameter per line from /drivers/nvidia.conf, the kernelModuleConfig
ConfigMap's key (gpu-driver-container: _get_module_params). Sources: docs/vm-passthrough.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.render.facts import NodeFacts
from gpu_operator.vocabulary import (
    NFD_DEVICE_LABEL_PREFIX,
    NFD_HYPERVISOR,
    NVLINK_DISABLE_PARAM,
    NVLINK_FABRIC_GPUS,
    NVSWITCH_DEVICES,
)

# The driver DaemonSets of those nodes carry this suffix; their ConfigMap is this one (ours).
DAEMONSET_SUFFIX = "-guest-nvlink-off"
CONFIGMAP = "nvidia-driver-guest-nvlink-off"
MODULE_FILE = "nvidia.conf"
PARAM_LINE = f"{NVLINK_DISABLE_PARAM}=1"


def needs_nvlink_off(node: NodeFacts) -> bool:
    """A VM guest (NFD's cpu-cpuid.HYPERVISOR) given NVSwitch-fabric GPUs (their pci-10de_<device>
    labels) and no NVSwitch (none of those labels; our node discovery labels NVSwitches as it
    labels GPU models: NFD configured without PCI class 0680 would not, see the docs)."""
    labels = node.labels

    def has(device: str) -> bool:
        return labels.get(f"{NFD_DEVICE_LABEL_PREFIX}{device}.present") == "true"

    return (
        labels.get(NFD_HYPERVISOR) == "true"
        and any(has(d) for d in NVLINK_FABRIC_GPUS)
        and not any(has(d) for d in NVSWITCH_DEVICES)
    )


def guest_nodes(nodes: Iterable[NodeFacts]) -> list[str]:
    """The names of the GPU nodes that need NVLink off, sorted."""
    return sorted(n.name for n in nodes if n.gpu and needs_nvlink_off(n))


def _sets_param(text: str) -> bool:
    return any(line.strip().split("=", 1)[0].strip() == NVLINK_DISABLE_PARAM for line in text.splitlines())


def merged(user: Mapping[str, str] | None) -> dict[str, str]:
    """Our ConfigMap's data: every key of the user's kernel-module ConfigMap as it is, and nvidia.conf
    with NVreg_NvLinkDisable=1 appended unless the user's nvidia.conf sets that parameter (theirs wins)."""
    data = dict(user or {})
    text = data.get(MODULE_FILE, "")
    if not _sets_param(text):
        text += ("" if not text or text.endswith("\n") else "\n") + PARAM_LINE + "\n"
    data[MODULE_FILE] = text
    return data


def restrict(pod: dict[str, Any], names: list[str], inside: bool) -> None:
    """Keep a driver pod on (`inside`) or off the named nodes: a required node-affinity on the
    node's name, ANDed into every existing term."""
    field = {"key": "metadata.name", "operator": "In" if inside else "NotIn", "values": list(names)}
    affinity = pod.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchFields", []).append(dict(field))
