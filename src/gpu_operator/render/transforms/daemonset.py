"""DaemonSet-wide settings from `spec.daemonsets` and `spec.hostPaths` (applied to every operand)."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec, DaemonsetsSpec
from gpu_operator.api.healthpolicy import DEFAULT_STARTUP_TAINT
from gpu_operator.render.objects import find, upsert_env
from gpu_operator.vocabulary import HEALTH_TAINT, PART_OF

DEFAULT_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
# Ours: the operands keep running on (and come back to) a node quarantined for GPU health, whatever
# the taint's effect: the driver, device plugin and validator's health agent are what remediate it
# (docs/health.md). Added to the policy's own tolerations unless one already covers it.
HEALTH_TOLERATION = {"key": HEALTH_TAINT, "operator": "Exists"}
# Ours too: the startup taint a policy names (spec.health.startupTaint: enabled, or another key, as
# for a Node Readiness Controller's readiness.k8s.io/ taint the operator leaves to it) is
# tolerated, whatever its effect, so the operands that validate the node run on it while it is on.
DEFAULT_PRIORITY_CLASS = "system-node-critical"
# Labels the operator owns on pod templates; spec.daemonsets.labels never override them (nor a
# DaemonSet's selector labels: a pod template must match its selector).
PROTECTED_LABELS = ("app", PART_OF)


def common_config(ds: dict[str, Any], spec: ClusterPolicySpec, *, on_delete: bool = False) -> None:
    """Update strategy, priority class, tolerations, pod security context, extra labels/annotations."""
    daemonsets = spec.daemonsets
    if on_delete or daemonsets.updateStrategy == "OnDelete":
        ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    else:
        strategy: dict[str, Any] = {"type": "RollingUpdate"}
        if daemonsets.rollingUpdate and daemonsets.rollingUpdate.maxUnavailable:
            value = daemonsets.rollingUpdate.maxUnavailable
            strategy["rollingUpdate"] = {"maxUnavailable": int(value) if value.isdigit() else value}
        ds["spec"]["updateStrategy"] = strategy
    pod_wide(ds, daemonsets, startup_taint(spec))


def startup_taint(spec: ClusterPolicySpec) -> str | None:
    """The startup taint key the policy names: when the operator removes it (enabled), or when its
    key is another than the default (another controller removes it); None otherwise. (Not "when
    set": the apiserver fills the default key into every stored policy with spec.health.)"""
    taint = spec.health.startupTaint if spec.health else None
    if taint is None or not (taint.enabled or taint.key != DEFAULT_STARTUP_TAINT):
        return None
    return taint.key


def _tolerated(tolerations: list[dict[str, Any]], key: str) -> bool:
    """Whether a toleration covers every effect of the taint `key`."""
    return any(
        t.get("key") in (key, None, "") and t.get("operator") == "Exists" and not t.get("effect")
        for t in tolerations
    )


def pod_wide(ds: dict[str, Any], daemonsets: DaemonsetsSpec, startup: str | None = None) -> None:
    """`spec.daemonsets` on a DaemonSet's pods: priority class, tolerations (the nvidia.com/gpu taint
    when none are given; always the GPU health quarantine taint, and the `startup` taint key when
    the policy names one), pod security context, extra labels and annotations."""
    pod = ds["spec"]["template"]["spec"]
    pod["priorityClassName"] = daemonsets.priorityClassName or DEFAULT_PRIORITY_CLASS
    pod["tolerations"] = (
        [t.dump() for t in daemonsets.tolerations]
        if daemonsets.tolerations
        else [dict(t) for t in DEFAULT_TOLERATIONS]
    )
    if not _tolerated(pod["tolerations"], HEALTH_TAINT):
        pod["tolerations"].append(dict(HEALTH_TOLERATION))
    if startup and not _tolerated(pod["tolerations"], startup):
        pod["tolerations"].append({"key": startup, "operator": "Exists"})
    if daemonsets.podSecurityContext:
        pod["securityContext"] = daemonsets.podSecurityContext.dump()
    template_meta = ds["spec"]["template"]["metadata"]
    selector = ds["spec"].get("selector", {}).get("matchLabels", {})
    for source, key in ((daemonsets.labels, "labels"), (daemonsets.annotations, "annotations")):
        for name, value in (source or {}).items():
            if key == "labels" and (name in PROTECTED_LABELS or name in selector):
                continue
            template_meta.setdefault(key, {})[name] = value
            ds["metadata"].setdefault(key, {}).setdefault(name, value)


def host_root(ds: dict[str, Any], root: str) -> None:
    """A custom host root moves the `host-root`/`host-dev-char` volumes and tells containers."""
    if root in ("", "/"):
        return
    pod = ds["spec"]["template"]["spec"]
    found = False
    for volume in pod.get("volumes", []):
        if volume["name"] == "host-root":
            volume["hostPath"]["path"] = root
            found = True
        elif volume["name"] == "host-dev-char":
            volume["hostPath"]["path"] = root.rstrip("/") + "/dev/char"
        elif volume["name"] == "host-root-sys":
            volume["hostPath"]["path"] = root.rstrip("/") + "/sys"
    if found:  # init containers too: the driver validation writes the driver root under it
        for ctr in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            upsert_env(ctr, "HOST_ROOT", root)


def driver_install_dir(ds: dict[str, Any], path: str) -> None:
    """A custom driver install dir moves volume `driver-install-dir` and the validator's view of it."""
    if path in ("", "/run/nvidia/driver"):
        return
    pod = ds["spec"]["template"]["spec"]
    for volume in pod.get("volumes", []):
        if volume["name"] == "driver-install-dir":
            volume["hostPath"]["path"] = path
    validation = find(pod, "driver-validation")
    if validation is not None:
        for volume_mount in validation.get("volumeMounts", []):
            if volume_mount["name"] == "driver-install-dir":
                volume_mount["mountPath"] = path
        upsert_env(validation, "DRIVER_INSTALL_DIR", path)
        upsert_env(validation, "DRIVER_INSTALL_DIR_CTR_PATH", path)
