"""Which pods hold a node's GPUs, pure: the rule a drain (driver upgrades' GPU pod deletion, GPU
health remediation) uses to find every pod that must be gone before the driver is unloaded or a
GPU is reset, and node labelling uses to find the nodes where a DRA claim still holds a GPU.

A pod holds GPUs when (docs/upgrades.md#which-pods-hold-gpus):
- a container requests or limits nvidia.com/gpu* or nvidia.com/mig-* (the device plugin's; from
  v0.20 a MIG profile with an attribute suffix is a resource of its own, nvidia.com/mig-1g.10gb.me,
  mig-1g.10gb.me.all, mig-1g.24gb.gfx, mig-1g.24gb-me: all under nvidia.com/mig-, sim/standins/migresources.py);
- one of its ResourceClaims is allocated a device of gpu.nvidia.com (NVIDIA's DRA driver) without
  admin access (the monitoring operands' management view consumes nothing), as NVIDIA's operator
  decides; a claim the pod names that cannot be read counts, as there;
- it runs under a RuntimeClass that gives GPUs (the policy's runtimeClass, nvidia-cdi,
  nvidia-legacy) and does not turn them all off (NVIDIA_VISIBLE_DEVICES void, none or empty in
  every container): the image's own environment (CUDA images set NVIDIA_VISIBLE_DEVICES=all) is not
  visible in the pod, so the class alone counts;
- or a container sets NVIDIA_VISIBLE_DEVICES to devices where that alone reaches them: the
  nvidia runtime is the node's default (the toolkit's set-as-default; without CDI it is on) or the
  toolkit is not ours to know (toolkit.enabled=false).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.controllers.views import ClusterPolicyView
from gpu_operator.render.states.prerequisites import CDI_CLASSES

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
GPU_DRA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver for GPUs (render/dra's GPU_DRIVER)
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NO_DEVICES = ("", "void", "none")  # the toolkit's values for "no GPU in this container"
# the toolkit's set-as-default switch, by each name it reads (NVIDIA_RUNTIME_* first)
SET_AS_DEFAULT = ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT", "DOCKER_SET_AS_DEFAULT")

ClaimKey = tuple[str, str]  # (namespace, name)


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    """upstream's pod filter: a container requests or limits nvidia.com/gpu* or nvidia.com/mig-*."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            for name in resources.get(section) or {}:
                if name.startswith(GPU_RESOURCE_PREFIXES):
                    return True
    return False


def gpu_results(claim: Mapping[str, Any], *, admin_access: bool) -> Iterator[Mapping[str, Any]]:
    """The allocation results of a claim that are gpu.nvidia.com devices (`admin_access`: those
    allocated with admin access too)."""
    devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    for result in devices.get("results") or []:
        if result.get("driver") == GPU_DRA_DRIVER and (admin_access or not result.get("adminAccess")):
            yield result


def claim_keys(pod: Mapping[str, Any]) -> list[ClaimKey]:
    """The ResourceClaims a pod's claims resolve to: a named claim, or the one generated from a
    template (its name in status.resourceClaimStatuses); none yet for a claim not created."""
    namespace = (pod.get("metadata") or {}).get("namespace", "")
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    keys = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if name:
            keys.append((namespace, name))
    return keys


def holds_gpu_claim(pod: Mapping[str, Any], claims: Mapping[ClaimKey, Mapping[str, Any]] | None) -> bool:
    """A claim of the pod is allocated a gpu.nvidia.com device (not for admin access). `claims`:
    those read (None: none could be); a claim the pod names that is not among them counts."""
    for key in claim_keys(pod):
        claim = None if claims is None else claims.get(key)
        if claim is None or any(gpu_results(claim, admin_access=False)):
            return True
    return False


def claim_holding_nodes(claims: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Nodes where an allocated, reserved ResourceClaim holds a device of gpu.nvidia.com, admin
    access included (the kubelet plugin must unprepare those too); the allocation's pool is the
    node whose ResourceSlices offered it."""
    nodes: set[str] = set()
    for claim in claims:
        if (claim.get("status") or {}).get("reservedFor"):
            nodes.update(r["pool"] for r in gpu_results(claim, admin_access=True) if r.get("pool"))
    return frozenset(nodes)


@dataclass(frozen=True)
class RuntimeAccess:
    """How a pod reaches GPUs without asking the scheduler: the RuntimeClasses whose handler is
    NVIDIA's runtime, and whether NVIDIA_VISIBLE_DEVICES alone does (the nvidia runtime is the
    default, or we cannot know)."""

    classes: frozenset[str] = frozenset(("nvidia", *CDI_CLASSES))
    env_alone: bool = False

    @classmethod
    def of(cls, spec: ClusterPolicySpec) -> RuntimeAccess:
        explicit = next(
            (e.value for name in SET_AS_DEFAULT for e in spec.toolkit.env or [] if e.name == name), None
        )
        default = explicit.strip().lower() == "true" if explicit is not None else not spec.cdi.on()
        return cls(
            classes=frozenset((spec.operator.runtimeClass, *CDI_CLASSES)),
            env_alone=not spec.toolkit.on() or default,
        )


def runtime_access(policy: ClusterPolicyView | None) -> RuntimeAccess:
    """The active ClusterPolicy's RuntimeAccess; the defaults without one (a GPUCluster's nodes) or
    with one the api model refuses."""
    model = policy.parsed.model if policy is not None else None
    return RuntimeAccess.of(model.spec) if model is not None else RuntimeAccess()


def _devices(container: Mapping[str, Any]) -> str:
    """A container's NVIDIA_VISIBLE_DEVICES: its value ("" when unset, as the toolkit reads no
    variable), "all" when set from elsewhere (valueFrom: unknown here, so counted)."""
    value = ""
    for env in container.get("env") or []:
        if env.get("name") == VISIBLE_DEVICES:  # the last definition wins, as in the container
            value = "all" if "valueFrom" in env else str(env.get("value", "")).strip().lower()
    return value


def reaches_gpu_by_runtime(pod: Mapping[str, Any], access: RuntimeAccess) -> bool:
    """Under a GPU RuntimeClass unless every container turns the GPUs off explicitly; else by
    NVIDIA_VISIBLE_DEVICES where that alone reaches them. Init containers count (a pending pod's
    may be running)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if spec.get("runtimeClassName") in access.classes:
        return not containers or not all(_is_off(c) for c in containers)
    return access.env_alone and any(_devices(c) not in NO_DEVICES for c in containers)


def _is_off(container: Mapping[str, Any]) -> bool:
    """NVIDIA_VISIBLE_DEVICES set to void, none or empty: the runtime gives this container no GPU."""
    return (
        any(e.get("name") == VISIBLE_DEVICES for e in container.get("env") or [])
        and _devices(container) in NO_DEVICES
    )


def holds_gpu(
    pod: Mapping[str, Any], access: RuntimeAccess, claims: Mapping[ClaimKey, Mapping[str, Any]] | None
) -> bool:
    """Whether the pod holds GPUs of its node, by any of the ways above."""
    return requests_gpu(pod) or holds_gpu_claim(pod, claims) or reaches_gpu_by_runtime(pod, access)
