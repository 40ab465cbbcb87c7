"""State 16, state-vfio-manager: binds the GPUs of vm-passthrough (and mixed) nodes to vfio-pci.

The DaemonSet runs our `gpu-operator node vfio-manage reconcile` from our image, not NVIDIA's
script: the same safety rules as the command (IOMMU on, no foreign device in the IOMMU group, no
process holding /dev/nvidiaN, idempotent), only the GPUs a mixed node lists, and the result on the
Node (label nvidia.com/gpu.vfio.state, annotation nvidia.com/gpu.vfio.result, an Event). No
k8s-driver-manager init container (it unloads the host driver, and skips the node silently when the
driver is pre-installed) and no preStop unbind (a restarted pod must not pull GPUs out of VMs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpu_operator.render.objects import (
    NODE_NAME,
    OPERATOR_NAMESPACE,
    Ctx,
    container,
    env,
    hostpath,
    mount,
    obj,
)
from gpu_operator.render.operand import (
    DaemonSetDef,
    Operand,
    OwnImage,
    build_daemonset,
    nvidia_selector,
    rbac,
    rule,
)
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import HOST_ROOT, HOST_ROOT_SYS, SYS, _because, _is_on, sandbox

NAME = "nvidia-vfio-manager"
# The probe (ours): publishes each node's driver source and per-GPU facts (address, vendor:device,
# name, bound driver) as the annotation nvidia.com/gpu.probe.facts, which the KubeVirt sync reads,
# and a Warning Event for a host driver on a passthrough GPU. It runs on the passthrough nodes (the
# vfio-manager deploy label) wherever sandbox workloads are on, whatever vfioManager says: with the
# vfio manager off (GPUs bound to vfio-pci at boot) the KubeVirt sync still needs its facts.
PROBE = "nvidia-gpu-probe"
PROBE_INTERVAL_SECONDS = 60
RBAC = "rbac.authorization.k8s.io/v1"
# Both agents touch only their own Node and record Events about it (namespace default).
NODE_RULES = (rule([""], ["nodes"], ["get", "patch"]), rule([""], ["events"], ["create"]))


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        NAME,
        command=["gpu-operator", "node", "vfio-manage", "reconcile"],
        env_vars=[env("GPU_OPERATOR_HOST_ROOT", "/host"), NODE_NAME, OPERATOR_NAMESPACE],
        # sysfs writes (driver_override, bind/unbind) go through the host root, read-only but for its
        # sysfs; modprobe vfio-pci runs chrooted into it (reads only). Writes nothing in its own image.
        mounts=[
            mount("host-sys", "/sys"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("host-root-sys", "/host/sys"),
            mount("lib-modules", "/lib/modules", readonly=True),
        ],
        securityContext={"privileged": True, "readOnlyRootFilesystem": True},
    )
    return {
        "hostPID": True,
        "containers": [main],
        "volumes": [HOST_ROOT, SYS, HOST_ROOT_SYS, hostpath("lib-modules", "/lib/modules")],
    }


def _probe_pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        PROBE,
        command=[
            "gpu-operator",
            "node",
            "probe",
            "--publish",
            f"--interval={PROBE_INTERVAL_SECONDS}",
            # a node without the workload label is what the policy's default says, as for the operator
            f"--default-workload={ctx.spec.default_workload()}",
        ],
        env_vars=[env("GPU_OPERATOR_HOST_ROOT", "/host"), NODE_NAME, OPERATOR_NAMESPACE],
        mounts=[mount("host-root", "/host", readonly=True, propagation="HostToContainer")],
        # reads every process's fds under /host/proc; writes nothing in its own image
        securityContext={"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True},
    )
    return {"hostPID": True, "containers": [main], "volumes": [HOST_ROOT]}


def _probe_rbac(ctx: Ctx, state: str) -> list[Manifest]:
    subject = [{"kind": "ServiceAccount", "name": PROBE, "namespace": ctx.ns}]
    return [
        obj("v1", "ServiceAccount", PROBE, state, ctx.ns),
        obj(RBAC, "ClusterRole", PROBE, state, None, rules=list(NODE_RULES)),
        obj(
            RBAC,
            "ClusterRoleBinding",
            PROBE,
            state,
            None,
            subjects=subject,
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PROBE},
        ),
    ]


VFIO = DaemonSetDef(
    name=NAME,
    deploy="vfio-manager",
    image=OwnImage("vfioManager", "VFIO_MANAGER_IMAGE"),
    pod=_pod,
    selector=nvidia_selector(NAME, key="name"),
)
PROBE_DS = DaemonSetDef(
    name=PROBE, deploy="vfio-manager", image=OwnImage("vfioManager", "VFIO_MANAGER_IMAGE"), pod=_probe_pod
)


def _daemonsets(operand: Operand, ctx: Ctx) -> list[Manifest]:
    # each with the RBAC it is rendered with (the vfio manager's in _extras, the probe's in
    # _probe_rbac: both NODE_RULES), so each pod keeps its ServiceAccount token
    vfio = (
        (dataclasses.replace(operand, account=NAME, cluster_rules=NODE_RULES),)
        if _is_on(ctx, "vfioManager")
        else ()
    )
    probe = dataclasses.replace(operand, account=PROBE, cluster_rules=NODE_RULES)
    return [*(build_daemonset(VFIO, v, ctx) for v in vfio), build_daemonset(PROBE_DS, probe, ctx)]


def _gate(ctx: Ctx) -> tuple[bool, str]:
    """Sandbox workloads on; the vfio manager with vfioManager on, the probe either way."""
    on, why = sandbox()(ctx)
    if not on:
        return False, why
    if _is_on(ctx, "vfioManager"):
        return True, f"{why}, {_because(ctx, 'vfioManager')}"
    return (
        True,
        f"{why}, {_because(ctx, 'vfioManager')}: the GPU probe only (the KubeVirt sync reads its facts)",
    )


# the vfio manager's own RBAC, rendered with its DaemonSet only: its own Node (read the passthrough
# list, write the result) and the Event about it
VFIO_RBAC = Operand(state="state-vfio-manager", gate=_gate, account=NAME, cluster_rules=NODE_RULES)


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    vfio = rbac(VFIO_RBAC, ctx) if _is_on(ctx, "vfioManager") else []
    return [*vfio, *_probe_rbac(ctx, state)]


OPERAND = Operand(
    state="state-vfio-manager",
    gate=_gate,
    extras=_extras,
    daemonsets=_daemonsets,
)
