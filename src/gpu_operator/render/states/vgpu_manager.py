"""State 13, state-vgpu-manager: the NVIDIA vGPU host driver on vm-vgpu nodes."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx, container, hostpath, mount
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.states._common import HOST_ROOT, SYS, VALIDATIONS, sandbox
from gpu_operator.render.states._driver_like import driver_manager_init
from gpu_operator.render.transforms.driver import driver_image
from gpu_operator.render.transforms.driver_manager import driver_manager

NAME = "nvidia-vgpu-manager"


def _gate(ctx: Ctx) -> tuple[bool, str]:
    if ctx.spec.driver.useNvidiaDriverCRD:
        return False, "spec.driver.useNvidiaDriverCRD=true: NVIDIADriver objects manage the vGPU manager"
    return sandbox("vgpuManager")(ctx)


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        "nvidia-vgpu-manager-ctr",
        command=["nvidia-driver"],
        args=["init"],
        # the vGPU host driver: built against the host (os-release), binds VFs (/dev/vfio), loads firmware
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("host-os-release", "/host-etc/os-release", readonly=True),
            mount("vfio", "/dev/vfio"),
            mount("host-cgroup", "/sys/fs/cgroup"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            mount("nv-firmware", "/lib/firmware"),
        ],
        privileged=True,
    )
    return {
        "hostPID": True,
        "hostIPC": True,
        "initContainers": [driver_manager_init(evict=False)],
        "containers": [main],
        "volumes": [
            hostpath("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            HOST_ROOT,
            SYS,
            hostpath("var-log", "/var/log"),
            hostpath("dev-log", "/dev/log"),
            VALIDATIONS,
            hostpath("host-os-release", "/etc/os-release"),
            hostpath("vfio", "/dev/vfio"),
            hostpath("host-cgroup", "/sys/fs/cgroup"),
            hostpath("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            hostpath("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
        ],
    }


def _vgpu(ds: dict[str, Any], ctx: Ctx) -> None:
    pod = ds["spec"]["template"]["spec"]
    main = pod["containers"][0]
    main["image"] = driver_image(main["image"], ctx.facts.os_tag, None)
    driver_manager(
        pod,
        ctx.spec.vgpuManager.driverManager,
        dict(ctx.facts.operator_env),
        "spec.vgpuManager.driverManager",
        ctx.spec,
    )


OPERAND = Operand(
    state="state-vgpu-manager",
    gate=_gate,
    orphan_pods=lambda ctx: bool(ctx.spec.driver.useNvidiaDriverCRD),
    account=NAME,
    role_rules=(rule([""], ["configmaps"], ["get", "list", "watch"]),),
    cluster_rules=(
        rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
        rule([""], ["pods"], ["get", "list", "watch", "delete"]),
        rule([""], ["pods/eviction"], ["create"]),
        rule(["apps"], ["daemonsets"], ["get"]),
    ),
    daemonset=DaemonSetDef(
        name="nvidia-vgpu-manager-daemonset",
        deploy="vgpu-manager",
        image=Image("vgpuManager", "VGPU_MANAGER_IMAGE"),
        pod=_pod,
        labels={"app.kubernetes.io/component": "nvidia-vgpu-manager"},
        on_delete=True,
        transforms=(_vgpu,),
    ),
)
