"""The pod shared by the KubeVirt and Kata sandbox device plugins: wait for the workload, then serve."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import (
    NODE_NAME,
    Ctx,
    container,
    env,
    env_field,
    hostpath,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.states._common import DEVICE_PLUGINS, SYS, VALIDATIONS, sandbox
from gpu_operator.vocabulary import VALIDATIONS_DIR

WAIT_SCRIPT = (
    f"until [ -f {VALIDATIONS_DIR}/workload-type ]; do sleep 5; done; "
    f"case $(cat {VALIDATIONS_DIR}/workload-type) in "
    f"vm-passthrough) f={VALIDATIONS_DIR}/vfio-pci-ready ;; "
    f"vm-vgpu) f={VALIDATIONS_DIR}/vgpu-devices-ready ;; *) exit 0 ;; esac; "
    "until [ -f $f ]; do echo waiting for $f; sleep 5; done"
)


def sandbox_plugin_pod(main_name: str, extra_env: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    wait = container(
        "vfio-pci-validation",
        command=["sh", "-c"],
        args=[WAIT_SCRIPT],
        env_vars=[env("NVIDIA_VISIBLE_DEVICES", "void")],
        mounts=[mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="HostToContainer")],
        privileged=True,
    )
    main = container(
        main_name,
        env_vars=[NODE_NAME, env_field("POD_NAMESPACE", "metadata.namespace"), *extra_env],
        mounts=[
            mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            mount("vfio", "/dev/vfio"),
            mount("host-sys", "/sys"),
            mount("cdi-root", "/var/run/cdi"),
        ],
        privileged=True,
    )
    return {
        "initContainers": [wait],
        "containers": [main],
        "volumes": [
            VALIDATIONS,
            DEVICE_PLUGINS,
            hostpath("vfio", "/dev/vfio"),
            SYS,
            hostpath("cdi-root", "/var/run/cdi", "DirectoryOrCreate"),
        ],
    }


def sandbox_plugin_operand(
    *,
    state: str,
    account: str,
    daemonset: str,
    deploy: str,
    image: Image,
    mode: str,
    main: str,
    extra_env: tuple[dict[str, Any], ...] = (),
) -> Operand:
    """The KubeVirt and Kata sandbox device plugins differ only in names, image and sandbox mode."""

    def pod(ctx: Ctx, image_ref: str) -> dict[str, Any]:
        return sandbox_plugin_pod(main, extra_env)

    return Operand(
        state=state,
        gate=sandbox(image.field, mode=mode),
        account=account,
        # it publishes its devices as NodeFeature objects and looks up pods on its node
        role_rules=(
            rule([""], ["pods"], ["get", "list", "watch"]),
            rule(["nfd.k8s-sigs.io"], ["nodefeatures"], ["get", "list", "watch", "create", "update"]),
        ),
        cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]), rule([""], ["pods"], ["get"])),
        daemonset=DaemonSetDef(name=daemonset, deploy=deploy, image=image, pod=pod),
    )
