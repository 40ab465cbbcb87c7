"""Commands of the node area (registered on the top-level app by gpu_operator.cli)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpu_operator.node.options import HostRoot, WorkloadOption, host_fs


def _kube_view(namespace: str = "") -> Any:
    """The API view of this node when NODE_NAME is set and credentials are found; None otherwise."""
    node = os.environ.get("NODE_NAME", "")
    if not node:
        return None
    from lightkube.core.exceptions import ConfigError

    from gpu_operator.node.cluster.kubeapi import KubeNodeView

    try:
        return KubeNodeView(
            node, namespace or os.environ.get("OPERATOR_NAMESPACE", ""), os.environ.get("POD_NAME", "")
        )
    except ConfigError as err:
        typer.echo(f"note: no Kubernetes API access ({err}); node labels and pods are unavailable", err=True)
        return None


def probe(
    host_root: HostRoot = None,
    publish: Annotated[
        bool, typer.Option(help="Publish labels and events for NODE_NAME through the API.")
    ] = False,
    interval: Annotated[float, typer.Option(help="With --publish: seconds between probes.")] = 300.0,
    once: Annotated[bool, typer.Option(help="With --publish: probe and publish once, then exit.")] = False,
    workload_config: WorkloadOption = None,
    default_workload: Annotated[
        str | None,
        typer.Option(
            help="With --publish: the cluster's default workload (ClusterPolicy "
            "sandboxWorkloads.defaultWorkload) for a node without the workload label; "
            "the operator's probe DaemonSet sets it."
        ),
    ] = None,
    search_path: Annotated[
        list[str] | None, typer.Option(help="Extra directory to look for nvidia-smi in (repeatable).")
    ] = None,
) -> None:
    """Print what this host has (GPUs, driver source, IOMMU, runtime, CDI) as JSON; optionally publish it."""
    from gpu_operator.node.host.probe import probe as run_probe

    fs = host_fs(host_root)
    dirs = tuple(search_path or ())
    from gpu_operator.vocabulary import WORKLOAD_CONFIGS

    for option, value in (("--workload-config", workload_config), ("--default-workload", default_workload)):
        if value and value not in WORKLOAD_CONFIGS:
            raise typer.BadParameter(f"{option} {value!r}: use one of {', '.join(WORKLOAD_CONFIGS)}")
    if not publish:
        typer.echo(run_probe(fs, extra_search_dirs=dirs).model_dump_json(indent=2))
        return
    from gpu_operator.node.cluster.publish import publish_once

    view = _kube_view()
    if view is None:
        raise typer.BadParameter(
            "--publish needs NODE_NAME and Kubernetes API access (in-cluster or KUBECONFIG)"
        )
    last_codes: set[str] | None = None
    while True:
        last_codes, events = publish_once(
            fs,
            view,
            workload=workload_config,
            default_workload=default_workload,
            last_codes=last_codes,
            search_dirs=dirs,
        )
        for event in events:
            typer.echo(f"{event['reason']}: {event['message']}", err=True)
        if once:
            return
        time.sleep(interval)


def run_component(component: str, host_root: str | None, environ: dict[str, str]) -> None:
    """One validator component (or COMPONENT=metrics: the node-status exporter), upstream's env contract."""
    from gpu_operator.node.host.runner import HostRunner
    from gpu_operator.node.validate.base import Context, Outcome
    from gpu_operator.node.validate.config import METRICS, ValidatorConfig, ValidatorConfigError
    from gpu_operator.node.validate.run import validate as run_validation

    try:
        config = ValidatorConfig.from_env(environ)
    except ValidatorConfigError as err:
        raise typer.BadParameter(str(err)) from None
    if component == METRICS:
        serve_metrics(host_root, config, config.metrics_port, "0.0.0.0")
        return
    fs = host_fs(host_root)
    ctx = Context(
        fs, HostRunner(fs), config, kube=_kube_view(config.namespace), log=lambda m: typer.echo(m, err=True)
    )
    try:
        result = run_validation(ctx, component)
    except ValidatorConfigError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"{component}: {result.outcome}: {result.message}")
    if result.outcome == Outcome.FAILED:
        # Kubernetes shows this file's text as the container's termination message.
        termination = Path(environ.get("TERMINATION_LOG", "/dev/termination-log"))
        if termination.parent.is_dir() and os.access(termination.parent, os.W_OK):
            termination.write_text(result.message[:4096])
        raise typer.Exit(1)


def validate(
    component: Annotated[
        str,
        typer.Option(
            "--component",
            "-c",
            envvar="COMPONENT",
            help="What to validate (driver, toolkit, cuda, plugin, ...), or metrics to serve the status files.",
        ),
    ],
    host_root: HostRoot = None,
) -> None:
    """Validate one component and write its status file under <host-root>/run/nvidia/validations."""
    run_component(component, host_root, dict(os.environ))


def serve_metrics(host_root: str | None, config: Any, port: int, address: str) -> None:
    """Serve the node's validation state as Prometheus metrics until stopped."""
    from prometheus_client import start_http_server

    from gpu_operator.node.exporter import NodeStatusCollector, driver_answers, registry_for
    from gpu_operator.node.host.runner import HostRunner

    fs = host_fs(host_root)
    view = _kube_view(config.namespace)

    def devices() -> int | None:
        from gpu_operator.node.validate.workload import pick_gpu_resource

        allocatable = view.node_allocatable()
        resource = pick_gpu_resource(allocatable, config.resource_name)
        return int(allocatable[resource]) if resource else 0

    runner = HostRunner(fs)
    collector = NodeStatusCollector(
        fs,
        config.output_dir,
        driver_check=lambda: driver_answers(fs, runner, config.search_dirs),
        plugin_devices=devices if view else None,
    )
    start_http_server(port, addr=address, registry=registry_for(collector))
    typer.echo(f"serving node metrics on {address}:{port}/metrics", err=True)
    while True:
        time.sleep(3600)


def node_status_exporter(
    host_root: HostRoot = None,
    port: Annotated[int, typer.Option(envvar="METRICS_PORT", help="Port to serve /metrics on.")] = 8000,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "0.0.0.0",
) -> None:
    """Serve the node's validation state as Prometheus metrics (status files are read at each scrape)."""
    from gpu_operator.node.validate.config import ValidatorConfig, ValidatorConfigError

    try:
        config = ValidatorConfig.from_env(os.environ)
    except ValidatorConfigError as err:
        raise typer.BadParameter(str(err)) from None
    serve_metrics(host_root, config, port, address)


def doctor(
    host_root: HostRoot = None,
    workload_config: WorkloadOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    search_path: Annotated[
        list[str] | None, typer.Option(help="Extra directory to look for nvidia-smi in (repeatable).")
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            envvar="NODE_NAME",
            help="This host's Node: read its workload label, passthrough device list, MIG config and state, and "
            "what KubeVirt advertises.",
        ),
    ] = None,
    passthrough_devices: Annotated[
        str | None, typer.Option(help="A mixed node's GPUs for VMs (comma-separated PCI addresses).")
    ] = None,
    advertised: Annotated[
        list[str] | None,
        typer.Option(
            help="Offline: what KubeVirt advertises on this node, as VENDOR:DEVICE=COUNT (repeatable)."
        ),
    ] = None,
    cuda: Annotated[
        list[str] | None,
        typer.Option(
            "--cuda",
            help="A workload's CUDA version to check against the driver (repeatable): 12.4, "
            "CUDA_VERSION=12.4.1 or NVIDIA_REQUIRE_CUDA=cuda>=12.4 from its image.",
        ),
    ] = None,
    commands: Annotated[
        bool,
        typer.Option(
            "--commands/--no-commands",
            help="Run read-only nvidia-smi queries (MIG mode, "
            "processes on the GPUs) when the host has a driver.",
        ),
    ] = True,
) -> None:
    """Check one host for what breaks GPU nodes; each finding has severity, evidence and fix. Exit 1 on errors."""
    from rich.console import Console

    from gpu_operator.node.doctor.inputs import cluster_inputs
    from gpu_operator.node.doctor.report import run
    from gpu_operator.node.host.probe import probe as run_probe
    from gpu_operator.vocabulary import WORKLOAD_CONFIGS

    if workload_config and workload_config not in WORKLOAD_CONFIGS:
        raise typer.BadParameter(
            f"--workload-config {workload_config!r}: use one of {', '.join(WORKLOAD_CONFIGS)}"
        )
    from gpu_operator.node.doctor.troubleshoot import parse_cuda

    fs = host_fs(host_root)
    report = run_probe(fs, extra_search_dirs=tuple(search_path or ()))
    try:
        inputs = cluster_inputs(node, workload_config, passthrough_devices, advertised or [])
        wanted = [parse_cuda(c) for c in cuda or []]
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    code = run(
        report,
        inputs.workload,
        as_json,
        Console(file=sys.stdout, soft_wrap=as_json),
        passthrough_devices=inputs.passthrough_devices,
        advertised=inputs.advertised,
        unchecked=inputs.unchecked,
        extra=_troubleshoot(fs, report, wanted, commands)
        + _mig_node(node, inputs.labels, inputs.annotations),
    )
    raise typer.Exit(code)


def _mig_node(
    node: str | None, labels: dict[str, str] | None, annotations: dict[str, str] | None
) -> list[Any]:
    """The Node's MIG config and state, where doctor read the Node (--node)."""
    from gpu_operator.node.doctor import troubleshoot

    return troubleshoot.mig_node_findings(node or "", labels, annotations or {}) if labels is not None else []


def _troubleshoot(fs: Any, report: Any, cuda: list[tuple[int, int]], commands: bool) -> list[Any]:
    """doctor's checks beyond the probe: kernel log, kernel headers, CUDA versions, MIG."""
    from gpu_operator.node.doctor.report import host_checks
    from gpu_operator.node.host.runner import HostRunner

    return host_checks(fs, report, cuda, HostRunner(fs) if commands else None)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    node_app = typer.Typer(help="Node agents that describe this host.", no_args_is_help=True)
    node_app.command("probe")(probe)
    from gpu_operator.node.discover import discover

    node_app.command("discover")(discover)
    from gpu_operator.node.health.command import health

    node_app.command("health")(health)
    from gpu_operator.node.gpucheck.command import gpu_check

    node_app.command("gpu-check")(gpu_check)
    from gpu_operator.node.gpucheck.incontainer import cuda_check

    node_app.command("cuda-check")(cuda_check)
    from gpu_operator.node.vgpuhost.cli import vgpu_host_state

    node_app.command("vgpu-host-state")(vgpu_host_state)
    from gpu_operator.node.vfio.cli import vfio_app

    # Also under `node` (hidden): the vfio-manager DaemonSet runs `gpu-operator node vfio-manage reconcile`.
    node_app.add_typer(vfio_app, name="vfio-manage", hidden=True)
    app.add_typer(node_app, name="node")
    app.command("validate")(validate)
    app.add_typer(vfio_app, name="vfio-manage")
    app.command("node-status-exporter")(node_status_exporter)
    app.command("doctor")(doctor)
