"""State 15, state-sandbox-validation: validates vfio-pci, vGPU manager, vGPU devices and CC mode."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx, container, env, find, mount, remove_containers
from gpu_operator.render.operand import VALIDATOR, DaemonSetDef, Operand, nvidia_selector, rule
from gpu_operator.render.states import _vgpu_host_state
from gpu_operator.render.states._common import (
    DRIVER_INSTALL_DIR,
    HOST_ROOT,
    SYS,
    VALIDATIONS,
    sandbox,
    validator_init,
)
from gpu_operator.render.transforms.component import env_upsert
from gpu_operator.vocabulary import VALIDATIONS_DIR

NAME = "nvidia-sandbox-validator"
WORKLOAD_AWARE = ("vfio-pci", "vgpu-manager", "vgpu-devices")


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    validations = mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional")
    host = [
        mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
        mount("host-sys", "/sys"),
        validations,
    ]
    inits = [validator_init(component, mounts=host) for component in ("cc-manager", *WORKLOAD_AWARE)]
    # the vGPU manager check runs nvidia-smi from the vGPU manager's driver root
    inits[2]["volumeMounts"] = [
        *host,
        mount("driver-install-dir", "/run/nvidia/driver", propagation="HostToContainer"),
    ]
    restore = _vgpu_host_state.init_container(ctx, image)
    volumes = [VALIDATIONS, HOST_ROOT, SYS, DRIVER_INSTALL_DIR]
    if restore is not None:  # a vGPU host's VFs, types and MIG mode back before the vGPU manager check
        inits.insert([c["name"] for c in inits].index("vgpu-manager-validation"), restore[0])
        volumes += restore[1]
    main = container(
        NAME,
        command=["sh", "-c"],
        args=["echo all validations are successful; sleep infinity"],
        mounts=[validations],
        privileged=True,
        lifecycle={"preStop": {"exec": {"command": ["sh", "-c", f"rm -f {VALIDATIONS_DIR}/*-ready"]}}},
    )
    return {"hostPID": True, "initContainers": inits, "containers": [main], "volumes": volumes}


def _sandbox_validator(ds: dict[str, Any], ctx: Ctx) -> None:
    pod = ds["spec"]["template"]["spec"]
    if not ctx.spec.ccManager.on():
        remove_containers(pod, "cc-manager-validation")
    per_component = {
        "vfio-pci": ctx.spec.validator.vfioPCI,
        "vgpu-manager": ctx.spec.validator.vgpuManager,
        "vgpu-devices": ctx.spec.validator.vgpuDevices,
    }
    for component in WORKLOAD_AWARE:
        ctr = find(pod, f"{component}-validation")
        if ctr is None:
            continue
        ctr.setdefault("env", []).append(env("DEFAULT_GPU_WORKLOAD_CONFIG", ctx.spec.default_workload()))
        extra = per_component[component]
        if extra is not None:
            env_upsert(ctr, extra.env)


OPERAND = Operand(
    state="state-sandbox-validation",
    gate=sandbox(),
    account=NAME,
    role_rules=(rule([""], ["pods"], ["get", "list"]),),
    # patch and events: the vGPU host-state init container records its result on its Node
    cluster_rules=(
        rule([""], ["nodes"], ["get", "list", "watch", "patch"]),
        rule([""], ["events"], ["create"]),
    ),
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="sandbox-validator",
        image=VALIDATOR,
        pod=_pod,
        transforms=(_sandbox_validator,),
        selector=nvidia_selector(NAME, part_of="gpu-operator"),
    ),
)
