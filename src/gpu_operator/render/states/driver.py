"""State 3, state-driver: the containerized NVIDIA driver (one DaemonSet, or one per kernel when precompiled)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpu_operator.api.clusterpolicy import NameSpec
from gpu_operator.render import guestnvlink
from gpu_operator.render.objects import (
    NODE_NAME,
    Ctx,
    configmap_volume,
    container,
    env_field,
    hostpath,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, build_daemonset, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import VALIDATIONS, configmap
from gpu_operator.render.states._driver_like import driver_manager_init
from gpu_operator.render.transforms import digest
from gpu_operator.render.transforms.driver import precompiled_name, transform_driver
from gpu_operator.vocabulary import COMPONENT, DRIVER_COMPONENT_VALUE, KERNEL_FULL, VALIDATIONS_DIR

STATE = "state-driver"
NAME = "nvidia-driver"
DAEMONSET = "nvidia-driver-daemonset"
PROBE_CM = "nvidia-driver-startup-probe"
READY = f"{VALIDATIONS_DIR}/.driver-ctr-ready"
PROBE_SCRIPT = f"""#!/bin/sh
# The driver container's startup probe. Ready when the module is loaded, the driver's helper
# daemons (when it reports them) say exactly Ready, and nvidia-smi works; then it records which
# GPUDirect modules this driver brings, for the validator to wait on before driver-ready.
set -eu
dir={VALIDATIONS_DIR}
mkdir -p "$dir"
[ -f /sys/module/nvidia/refcnt ] || {{ echo "the nvidia kernel module is not loaded"; exit 1; }}
if [ -f "$dir/.driver-daemons-status" ]; then
  daemons=$(head -n 1 "$dir/.driver-daemons-status" | tr -d '[:space:]')
  [ "$daemons" = Ready ] || {{ echo "driver daemons: ${{daemons:-no status}} (want Ready)"; exit 1; }}
fi
nvidia-smi > /dev/null || {{ echo "nvidia-smi failed"; exit 1; }}
{{
  echo "GDRCOPY_ENABLED: ${{GDRCOPY_ENABLED:-false}}"
  echo "GDS_ENABLED: ${{GDS_ENABLED:-false}}"
  echo "GPU_DIRECT_RDMA_ENABLED: ${{GPU_DIRECT_RDMA_ENABLED:-false}}"
}} > {READY}.tmp
mv {READY}.tmp {READY}
"""


def _gate(ctx: Ctx) -> tuple[bool, str]:
    driver = ctx.spec.driver
    if driver.useNvidiaDriverCRD:
        return False, (
            "spec.driver.useNvidiaDriverCRD=true: NVIDIADriver objects manage the driver "
            "(delete the ClusterPolicy's driver DaemonSets with propagationPolicy=Orphan)"
        )
    source = "" if driver.enabled is not None else " (default)"
    return driver.on(), f"spec.driver.enabled={str(driver.on()).lower()}{source}"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        "nvidia-driver-ctr",
        command=["nvidia-driver"],
        args=["init"],
        env_vars=[NODE_NAME, env_field("NODE_IP", "status.hostIP")],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
            mount("run-nvidia-topologyd", "/run/nvidia-topologyd"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount("host-os-release", "/host-etc/os-release", readonly=True),
            mount("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", propagation="HostToContainer"),
            mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer"),
            mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            mount("host-sys-devices-system", "/sys/devices/system"),
            mount("nv-firmware", "/lib/firmware"),
            mount(
                "driver-startup-probe-script", "/usr/local/bin/startup-probe.sh", sub_path="startup-probe.sh"
            ),
        ],
        securityContext={"privileged": True, "seLinuxOptions": {"level": "s0"}},
        startupProbe={
            "exec": {"command": ["sh", "/usr/local/bin/startup-probe.sh"]},
            "initialDelaySeconds": 60,
            "timeoutSeconds": 60,
            "periodSeconds": 10,
            "successThreshold": 1,
            "failureThreshold": 120,
        },
        lifecycle={"preStop": {"exec": {"command": ["/bin/sh", "-c", f"rm -f {READY}"]}}},
    )
    logs = [mount("var-log", "/var/log"), mount("dev-log", "/dev/log")]
    selinux = {"privileged": True, "seLinuxOptions": {"level": "s0"}}

    def module_probe(check: str, **timing: int) -> dict[str, Any]:
        return {
            "exec": {"command": ["sh", "-c", check]},
            "successThreshold": 1,
            "timeoutSeconds": 10,
            **timing,
        }

    def gpudirect(name: str, program: str, module: str) -> dict[str, Any]:
        """GDS/GDRCopy: wait for the driver container's sources and module, then build and load."""
        return container(
            name,
            command=["bash", "-xc"],
            args=[
                "until [ -d /run/nvidia/driver/usr/src ] && lsmod | grep -q nvidia; do "
                f"echo waiting for the NVIDIA driver; sleep 10; done; exec {program} install"
            ],
            mounts=[mount("run-nvidia", "/run/nvidia", propagation="HostToContainer"), *logs],
            securityContext=dict(selinux),
            startupProbe=module_probe(
                f"lsmod | grep {module}", initialDelaySeconds=10, failureThreshold=120, periodSeconds=10
            ),
        )

    peermem_check = "nvidia-driver probe_nvidia_peermem"
    sidecars = [
        container(
            "nvidia-peermem-ctr",
            command=["nvidia-driver"],
            args=["reload_nvidia_peermem"],
            mounts=[
                mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
                *logs,
                mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer"),
            ],
            securityContext=dict(selinux),
            startupProbe=module_probe(
                peermem_check, initialDelaySeconds=10, failureThreshold=120, periodSeconds=10
            ),
            livenessProbe=module_probe(
                peermem_check, initialDelaySeconds=30, failureThreshold=1, periodSeconds=30
            ),
        ),
        gpudirect("nvidia-fs-ctr", "nvidia-gds-driver", "nvidia_fs"),
        gpudirect("nvidia-gdrcopy-ctr", "nvidia-gdrcopy-driver", "gdrdrv"),
    ]
    return {
        "hostPID": True,
        "initContainers": [driver_manager_init()],
        "containers": [main, *sidecars],
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {
                            "matchExpressions": [
                                {
                                    "key": COMPONENT,
                                    "operator": "In",
                                    "values": [DRIVER_COMPONENT_VALUE, "nvidia-vgpu-manager"],
                                }
                            ]
                        },
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "volumes": [
            hostpath("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
            hostpath("var-log", "/var/log"),
            hostpath("dev-log", "/dev/log"),
            hostpath("host-os-release", "/etc/os-release"),
            hostpath("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager", "DirectoryOrCreate"),
            hostpath("run-nvidia-topologyd", "/run/nvidia-topologyd", "DirectoryOrCreate"),
            hostpath("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", "DirectoryOrCreate"),
            hostpath("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
            VALIDATIONS,
            hostpath("host-root", "/"),
            hostpath("host-sys", "/sys", "Directory"),
            hostpath("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            hostpath("host-sys-devices-system", "/sys/devices/system", "Directory"),
            hostpath("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
            configmap_volume("driver-startup-probe-script", PROBE_CM, 0o755),
        ],
    }


def _variant(kernel: str | None, guests: list[str] | None = None, inside: bool = False) -> Any:
    """The driver DaemonSet's transform; with `guests` (VM guest nodes that need NVLink off), kept
    off those nodes, or (`inside`) on them only, reading our merged kernel-module ConfigMap."""

    def transform(ds: dict[str, Any], ctx: Ctx) -> None:
        spec, facts = ctx.spec, ctx.facts
        if inside:
            spec = spec.model_copy(deep=True)
            spec.driver.kernelModuleConfig = NameSpec(name=guestnvlink.CONFIGMAP)
            keys = tuple(sorted(_guest_data(ctx)))
            facts = dataclasses.replace(
                facts, configmap_keys={**facts.configmap_keys, guestnvlink.CONFIGMAP: keys}
            )
        transform_driver(ds, spec, facts, kernel)
        template = ds["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("annotations", {})[
            "kubectl.kubernetes.io/default-container"
        ] = "nvidia-driver-ctr"
        if guests:
            guestnvlink.restrict(template["spec"], guests, inside)
        digest.stamp(template["spec"])

    return transform


def _guests(ctx: Ctx) -> list[str]:
    return guestnvlink.guest_nodes(ctx.facts.gpu_nodes) if ctx.spec.driver.guest_nvlink_disable() else []


def _guest_data(ctx: Ctx) -> dict[str, str]:
    """The user's kernel-module ConfigMap (as the operator read it; none: empty) merged with the parameter."""
    ref = ctx.spec.driver.kernelModuleConfig
    user = ctx.facts.configmap_data.get(ref.name) if ref and ref.name else None
    return guestnvlink.merged(user)


BASE = DaemonSetDef(
    name=DAEMONSET,
    deploy="driver",
    # driver.version alone takes the operator's DRIVER_IMAGE with that tag (NVIDIA's operator ignores
    # it without driver.repository and driver.image); precompiled: the branch, `-<kernel>-<os>` added
    image=Image("driver", "DRIVER_IMAGE"),
    pod=_pod,
    labels={COMPONENT: DRIVER_COMPONENT_VALUE},
    on_delete=True,
)


def _daemonsets(operand: Operand, ctx: Ctx) -> list[Manifest]:
    guests = _guests(ctx)
    kernels: list[str | None] = list(ctx.facts.kernels) if ctx.spec.driver.precompiled() else [None]
    out = []
    for kernel in kernels:
        base = (
            BASE
            if kernel is None
            else dataclasses.replace(
                BASE, name=precompiled_name(kernel, ctx.facts.os_tag), node_selector={KERNEL_FULL: kernel}
            )
        )
        out.append(
            build_daemonset(dataclasses.replace(base, transforms=(_variant(kernel, guests),)), operand, ctx)
        )
        if guests:
            # the VM guests whose NVLink GPUs have no NVSwitch: a DaemonSet of their own (docs/vm-passthrough.md)
            guest = dataclasses.replace(
                base,
                name=base.name + guestnvlink.DAEMONSET_SUFFIX,
                transforms=(_variant(kernel, guests, inside=True),),
            )
            out.append(build_daemonset(guest, operand, ctx))
    return out


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    out = [configmap(PROBE_CM, state, ctx, {"startup-probe.sh": PROBE_SCRIPT})]
    if _guests(ctx):
        out.append(configmap(guestnvlink.CONFIGMAP, state, ctx, _guest_data(ctx)))
    return out


OPERAND = Operand(
    state=STATE,
    gate=_gate,
    orphan_pods=lambda ctx: bool(ctx.spec.driver.useNvidiaDriverCRD),
    account=NAME,
    # no Role: the driver container and the driver manager read no ConfigMap or Secret through the
    # API (the kubelet mounts them), as NVIDIA's driver Role, which grants only the OpenShift SCC
    cluster_rules=(
        rule([""], ["nodes"], ["get", "list", "watch", "patch", "update"]),
        rule([""], ["pods"], ["get", "list", "watch", "delete"]),
        rule([""], ["pods/eviction"], ["create"]),
        rule(["apps"], ["daemonsets"], ["get", "list", "watch"]),
        rule(["config.openshift.io"], ["clusterversions"], ["get", "list"]),
        # k8s-driver-manager reads the claims of the node's pods before it evicts GPU pods
        rule(["resource.k8s.io"], ["resourceclaims"], ["get", "list"]),
    ),
    extras=_extras,
    daemonsets=_daemonsets,
)
