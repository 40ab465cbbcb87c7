"""`gpu-operator node vgpu-host-state`: the sandbox validator's init container on vGPU hosts (and a
command for a host by hand): wait for the vGPU manager's driver, then one restore pass."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from gpu_operator.node.options import HostRoot, host_fs

VGPU_MODULE = "nvidia_vgpu_vfio"


def driver_ready(fs: object, driver_root: str) -> tuple[str | None, str, str]:
    """(why not ready, run root, nvidia-smi path): the vGPU manager's module loaded and nvidia-smi found."""
    from gpu_operator.node.host.driver import detect_driver, module_names
    from gpu_operator.node.host.hostfs import HostFS

    assert isinstance(fs, HostFS)
    if VGPU_MODULE not in module_names(fs) and not fs.exists(f"/sys/module/{VGPU_MODULE}"):
        return f"the vGPU manager's module {VGPU_MODULE} is not loaded", "/", ""
    info = detect_driver(fs, operator_root=driver_root)
    if info.smi_in_root is None:
        return f"no nvidia-smi on the host or under {driver_root}", "/", ""
    return None, info.run_root, info.smi_in_root


def vgpu_host_state(
    host_root: HostRoot = None,
    config_file: Annotated[
        str, typer.Option(envvar="CONFIG_FILE", help="The vGPU device manager's config file.")
    ] = "/vgpu-config/config.yaml",
    default_config: Annotated[
        str,
        typer.Option(
            envvar="DEFAULT_VGPU_CONFIG", help="Config when the node has no nvidia.com/vgpu.config label."
        ),
    ] = "default",
    default_workload: Annotated[
        str,
        typer.Option(
            envvar="DEFAULT_GPU_WORKLOAD_CONFIG",
            help="Workload when the node has no nvidia.com/gpu.workload.config label.",
        ),
    ] = "container",
    fabric_mode: Annotated[
        int | None,
        typer.Option(
            envvar="FABRIC_MODE",
            help="Fabric Manager's FABRIC_MODE on NVSwitch hosts (2: vGPU multitenancy).",
        ),
    ] = None,
    driver_root: Annotated[
        str, typer.Option(help="The vGPU manager container's driver root on the host.")
    ] = "/run/nvidia/driver",
    wait_driver: Annotated[
        float, typer.Option(help="Seconds to wait for the vGPU manager's driver.")
    ] = 900.0,
    node: Annotated[
        bool, typer.Option(help="Read the Node's labels and record the result on it (NODE_NAME).")
    ] = True,
) -> None:
    """Restore this vGPU host's SR-IOV VFs, vGPU types, MIG mode and Fabric Manager mode after a reboot."""
    from gpu_operator.node.host.hostfs import KernelWriter
    from gpu_operator.node.host.runner import HostRunner
    from gpu_operator.node.vgpuhost.agent import Settings, run_pass
    from gpu_operator.node.vgpuhost.control import ToolControl

    fs = host_fs(host_root)
    view = None
    if node:
        from lightkube.core.exceptions import ConfigError

        from gpu_operator.node.cluster.kubeapi import KubeNodeView

        name = os.environ.get("NODE_NAME", "")
        if not name:
            raise typer.BadParameter("needs NODE_NAME (the downward API's spec.nodeName), or --no-node")
        try:
            view = KubeNodeView(
                name, os.environ.get("OPERATOR_NAMESPACE", ""), component="gpu-operator-vgpu-host-state"
            )
        except ConfigError as err:
            raise typer.BadParameter(
                f"needs Kubernetes API access (in-cluster or KUBECONFIG): {err}"
            ) from None
    from gpu_operator.vocabulary import VM_VGPU, WORKLOAD_CONFIG

    workload = (view.node_metadata()[0] if view is not None else {}).get(WORKLOAD_CONFIG) or default_workload
    if workload != VM_VGPU:  # before any wait: the sandbox validator runs this on passthrough nodes too
        typer.echo(f"workload config is {workload}: no vGPU host state to keep")
        return
    deadline = time.monotonic() + wait_driver
    while True:
        why, run_root, smi = driver_ready(fs, driver_root)
        if why is None or time.monotonic() >= deadline:
            break
        typer.echo(f"waiting for the vGPU manager: {why}")
        time.sleep(5)
    try:
        text: str | None = Path(config_file).read_text()
    except OSError:
        text = None
    settings = Settings(
        config_text=text,
        config_source=config_file,
        default_config=default_config,
        default_workload=default_workload,
        fabric_mode=fabric_mode,
        fabric_mode_source="FABRIC_MODE (spec.vgpuManager.env NVFM_CONFIG_FABRIC_MODE)",
    )
    if why is not None:
        typer.echo(f"the vGPU manager is not ready after {wait_driver:.0f}s: {why}", err=True)
        raise typer.Exit(1)
    result = run_pass(fs, KernelWriter(fs), ToolControl(HostRunner(fs), run_root, smi), view, settings)
    for line in result.lines():
        typer.echo(line)
    if result.state == "failed":
        raise typer.Exit(1)
