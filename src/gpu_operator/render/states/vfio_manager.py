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
from gpu_operator.render.operand import DaemonSetDef, Operand, OwnImage, build_daemonset, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import HOST_ROOT, SYS, sandbox

NAME = "nvidia-vfio-manager"
# The probe (ours): publishes each node's driver source and per-GPU facts (address, vendor:device,
# name, bound driver) as the annotation nvidia.com/gpu.probe.facts, which the KubeVirt sync reads,
# and a Warning Event for a host driver on a passthrough GPU. It runs where the vfio manager runs.
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
        # sysfs writes (driver_override, bind/unbind) go through the host root; modprobe vfio-pci
        # runs chrooted into it
        mounts=[mount("host-sys", "/sys"), mount("host-root", "/host", propagation="HostToContainer"),
                mount("lib-modules", "/lib/modules", readonly=True)],
        privileged=True,
    )
    return {"hostPID": True, "containers": [main], "volumes": [HOST_ROOT, SYS, hostpath("lib-modules", "/lib/modules")]}


def _probe_pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        PROBE,
        command=["gpu-operator", "node", "probe", "--publish", f"--interval={PROBE_INTERVAL_SECONDS}",
                 # a node without the workload label is what the policy's default says, as for the operator
                 f"--default-workload={ctx.spec.default_workload()}"],
        env_vars=[env("GPU_OPERATOR_HOST_ROOT", "/host"), NODE_NAME, OPERATOR_NAMESPACE],
        mounts=[mount("host-root", "/host", readonly=True, propagation="HostToContainer")],
        securityContext={"privileged": True, "runAsUser": 0},  # reads every process's fds under /host/proc
    )
    return {"hostPID": True, "containers": [main], "volumes": [HOST_ROOT]}


def _probe_rbac(ctx: Ctx, state: str) -> list[Manifest]:
    subject = [{"kind": "ServiceAccount", "name": PROBE, "namespace": ctx.ns}]
    return [obj("v1", "ServiceAccount", PROBE, state, ctx.ns),
            obj(RBAC, "ClusterRole", PROBE, state, None, rules=list(NODE_RULES)),
            obj(RBAC, "ClusterRoleBinding", PROBE, state, None, subjects=subject,
                roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PROBE})]


VFIO = DaemonSetDef(name=NAME, deploy="vfio-manager", image=OwnImage("vfioManager", "VFIO_MANAGER_IMAGE"), pod=_pod)
PROBE_DS = DaemonSetDef(name=PROBE, deploy="vfio-manager", image=OwnImage("vfioManager", "VFIO_MANAGER_IMAGE"),
                        pod=_probe_pod)


def _daemonsets(operand: Operand, ctx: Ctx) -> list[Manifest]:
    return [build_daemonset(VFIO, operand, ctx), build_daemonset(PROBE_DS, dataclasses.replace(operand, account=PROBE), ctx)]


OPERAND = Operand(
    state="state-vfio-manager",
    gate=sandbox("vfioManager"),
    account=NAME,
    # its own Node: read the passthrough list, write the result; the Event about it
    cluster_rules=NODE_RULES,
    extras=_probe_rbac,
    daemonsets=_daemonsets,
)
