"""State 4, state-container-toolkit: installs nvidia-container-toolkit and configures the runtime."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import (
    Ctx,
    configmap_volume,
    container,
    env,
    env_field,
    hostpath,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import (
    DRIVER_INSTALL_DIR,
    HOST_DEV_CHAR,
    HOST_ROOT,
    VALIDATIONS,
    configmap,
    validator_init,
    when_enabled,
)
from gpu_operator.render.transforms.runtime import toolkit_runtime
from gpu_operator.vocabulary import VALIDATIONS_DIR

STATE = "state-container-toolkit"
NAME = "nvidia-container-toolkit"
ENTRYPOINT = "nvidia-container-toolkit-entrypoint"
SCRIPT = """#!/bin/sh
# Wait until the driver is validated, take its location from driver-ready, then install.
until [ -f /run/nvidia/validations/driver-ready ]; do echo waiting for the driver; sleep 5; done
set -a; . /run/nvidia/validations/driver-ready; set +a
# containerd >= 1.6.9 may restart while we write its config: give it a moment
sleep 5
exec nvidia-toolkit
"""


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        "nvidia-container-toolkit-ctr",
        command=["/bin/entrypoint.sh"],
        env_vars=[
            env("ROOT", "/usr/local/nvidia"),
            env("NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", "management.nvidia.com/gpu"),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("TOOLKIT_PID_FILE", "/run/nvidia/toolkit/toolkit.pid"),
            env_field("NRI_NAMESPACE", "metadata.namespace"),
        ],
        mounts=[
            mount("nvidia-container-toolkit-entrypoint", "/bin/entrypoint.sh", readonly=True, sub_path="entrypoint.sh"),
            mount("toolkit-root", "/run/nvidia/toolkit"),
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer"),
            mount("toolkit-install-dir", "/usr/local/nvidia"),
            mount("driver-install-dir", "/driver-root", readonly=True, propagation="HostToContainer"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    driver = validator_init("driver", mounts=[
        mount("driver-install-dir", "/run/nvidia/driver", propagation="HostToContainer"),
        mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
        mount("host-dev-char", "/host-dev-char"),
        mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional"),
    ])
    return {
        "hostPID": True,
        "initContainers": [driver],
        "containers": [main],
        "volumes": [
            configmap_volume("nvidia-container-toolkit-entrypoint", ENTRYPOINT, 0o755),
            hostpath("toolkit-root", "/run/nvidia/toolkit", "DirectoryOrCreate"),
            VALIDATIONS,
            hostpath("toolkit-install-dir", "/usr/local/nvidia", "DirectoryOrCreate"),
            DRIVER_INSTALL_DIR,
            HOST_ROOT,
            HOST_DEV_CHAR,
            hostpath("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
        ],
    }


def _runtime(ds: dict[str, Any], ctx: Ctx) -> None:
    toolkit_runtime(ds["spec"]["template"]["spec"], ctx.spec, ctx.facts.runtime, ctx.facts.openshift)


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    return [configmap(ENTRYPOINT, state, ctx, {"entrypoint.sh": SCRIPT})]


OPERAND = Operand(
    state=STATE,
    gate=when_enabled("toolkit"),
    account=NAME,
    # driver-validation lists the driver DaemonSets in its namespace
    role_rules=(rule([""], ["pods"], ["get", "list"]), rule(["apps"], ["daemonsets"], ["get", "list"])),
    extras=_extras,
    daemonset=DaemonSetDef(
        name="nvidia-container-toolkit-daemonset",
        deploy="container-toolkit",
        image=Image("toolkit", "CONTAINER_TOOLKIT_IMAGE"),
        pod=_pod,
        transforms=(_runtime,),
    ),
)
