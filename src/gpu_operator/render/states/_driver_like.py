"""The k8s-driver-manager init container shared by the driver, vGPU manager and VFIO manager pods."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import NODE_NAME, container, env, env_field, mount


def driver_manager_init(*extra_env: dict[str, Any], evict: bool = True) -> dict[str, Any]:
    """Unloads a previous driver before the main container installs one.

    The driver's evicts GPU pods first (with the drain settings); the vGPU and VFIO managers'
    do not, as upstream's (their nodes run VMs, not GPU pods).
    """
    drain = (
        [
            env("DRAIN_USE_FORCE", "false"),
            env("DRAIN_POD_SELECTOR_LABEL", ""),
            env("DRAIN_TIMEOUT_SECONDS", "0s"),
            env("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
        ]
        if evict
        else []
    )
    mellanox = (
        [mount("run-mellanox-drivers", "/run/mellanox/drivers", propagation="HostToContainer")]
        if evict
        else []
    )
    return container(
        "k8s-driver-manager",
        command=["driver-manager"],
        args=["uninstall_driver"],
        env_vars=[
            NODE_NAME,
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("ENABLE_GPU_POD_EVICTION", str(evict).lower()),
            env("ENABLE_AUTO_DRAIN", "false"),
            *drain,
            env_field("OPERATOR_NAMESPACE", "metadata.namespace"),
            *extra_env,
        ],
        mounts=[
            mount("run-nvidia", "/run/nvidia", propagation="Bidirectional"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("host-sys", "/sys"),
            *mellanox,
        ],
        privileged=True,
    )
