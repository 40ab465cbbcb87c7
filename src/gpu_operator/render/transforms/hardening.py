"""Least privilege on every operand pod, as far as its image allows (docs/security.md, "Measured by checkov").

Applied last to each DaemonSet and Deployment the operator renders; each step only fills what the
policy and the state left unset, so `spec.<component>.resources` and `spec.daemonsets.podSecurityContext`
still win:

- resources: requests (and limits where a limit cannot stop the container's work) by container,
  NVIDIA's manifests set none (our deviation, docs/operands.md). The containers that build or load
  kernel modules, and the MPS control daemon, get requests only: a memory limit would OOM-kill a
  kernel module build (make runs one job per host CPU) or the MPS server every GPU client shares;
- pods with a container that is not privileged: seccomp RuntimeDefault at pod level; that container
  drops every capability (keeping what it adds), and may not escalate privileges. A privileged
  container runs with every capability and no seccomp filter whatever its securityContext says
  (containerd and CRI-O ignore both for it), so nothing is written there that would only look safer;
- the ServiceAccount token is not mounted into a pod whose operand has no Role or ClusterRole: its
  programs never call the apiserver.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from gpu_operator.render.objects import pod_containers

Resources = dict[str, dict[str, str]]

SMALL: Resources = {
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "512Mi"},
}
MEDIUM: Resources = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
REQUESTS_ONLY: Resources = {"requests": {"cpu": "100m", "memory": "256Mi"}}
# First match wins (fnmatch patterns over container names).
DEFAULT_RESOURCES: tuple[tuple[tuple[str, ...], Resources], ...] = (
    # kernel module builds and loads (the driver, vGPU manager, GPUDirect sidecars), the MPS server
    (
        (
            "nvidia-driver-ctr",
            "nvidia-vgpu-manager-ctr",
            "nvidia-fs-ctr",
            "nvidia-gdrcopy-ctr",
            "nvidia-peermem-ctr",
            "mps-control-daemon-ctr",
        ),
        REQUESTS_ONLY,
    ),
    # DCGM's host engine and the exporter hold a profile of every GPU
    (("nvidia-dcgm-ctr", "nvidia-dcgm-exporter*"), MEDIUM),
    (("*",), SMALL),
)
SECCOMP_DEFAULT = {"type": "RuntimeDefault"}


def default_resources(name: str) -> Resources:
    for patterns, value in DEFAULT_RESOURCES:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return {k: dict(v) for k, v in value.items()}
    raise AssertionError("the last pattern matches every name")  # pragma: no cover


def _privileged(ctr: dict[str, Any]) -> bool:
    return bool((ctr.get("securityContext") or {}).get("privileged"))


def harden_pod(pod: dict[str, Any], *, api_access: bool) -> None:
    """Fill what least privilege needs into one pod spec (see the module's docstring)."""
    containers = pod_containers(pod)
    for ctr in containers:
        res = ctr.setdefault("resources", {})  # may hold DRA claims only
        if not res.get("requests") and not res.get("limits"):
            res.update(default_resources(ctr["name"]))
        if _privileged(ctr):
            continue
        sc = ctr.setdefault("securityContext", {})
        sc.setdefault("allowPrivilegeEscalation", False)
        caps = sc.setdefault("capabilities", {})
        caps.setdefault("drop", ["ALL"])
    if any(not _privileged(c) for c in containers):
        pod.setdefault("securityContext", {}).setdefault("seccompProfile", dict(SECCOMP_DEFAULT))
    if not api_access:
        pod.setdefault("automountServiceAccountToken", False)


def harden(workload: dict[str, Any], *, api_access: bool = True) -> None:
    """harden_pod on a DaemonSet's or Deployment's pod template."""
    harden_pod(workload["spec"]["template"]["spec"], api_access=api_access)
