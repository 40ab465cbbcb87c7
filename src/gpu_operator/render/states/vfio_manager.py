"""State 16, state-vfio-manager: binds GPUs of vm-passthrough nodes to vfio-pci."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx, container, env, hostpath, mount
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.states._common import HOST_ROOT, SYS, VALIDATIONS, sandbox
from gpu_operator.render.states._driver_like import driver_manager_init
from gpu_operator.render.transforms.driver_manager import driver_manager

NAME = "nvidia-vfio-manager"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        "nvidia-vfio-manager",
        command=["vfio-manage"],
        args=["bind", "--all"],
        env_vars=[env("HOST_ROOT", "/host")],
        # modprobe vfio-pci needs the host's modules
        mounts=[mount("host-sys", "/sys"), mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
                mount("lib-modules", "/lib/modules", readonly=True)],
        privileged=True,
        lifecycle={"preStop": {"exec": {"command": ["vfio-manage", "unbind", "--all"]}}},
    )
    return {
        "hostPID": True,
        "initContainers": [driver_manager_init(evict=False)],
        "containers": [main],
        "volumes": [hostpath("run-nvidia", "/run/nvidia", "DirectoryOrCreate"), HOST_ROOT, SYS, VALIDATIONS,
                    hostpath("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
                    hostpath("lib-modules", "/lib/modules")],
    }


def _vfio(ds: dict[str, Any], ctx: Ctx) -> None:
    driver_manager(ds["spec"]["template"]["spec"], ctx.spec.vfioManager.driverManager,
                   dict(ctx.facts.operator_env), "spec.vfioManager.driverManager", ctx.spec)


OPERAND = Operand(
    state="state-vfio-manager",
    gate=sandbox("vfioManager"),
    account=NAME,
    role_rules=(rule([""], ["pods"], ["get", "list", "watch", "delete"]),
                rule(["apps"], ["daemonsets"], ["get", "list"])),
    # k8s-driver-manager looks for GPU pods on its node in every namespace
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
                   rule([""], ["pods"], ["get", "list", "watch"]),
                   rule([""], ["pods/eviction"], ["create"])),
    daemonset=DaemonSetDef(name=NAME, deploy="vfio-manager", image=Image("vfioManager", "VFIO_MANAGER_IMAGE"),
                           pod=_pod, transforms=(_vfio,)),
)
