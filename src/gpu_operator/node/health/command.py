"""`gpu-operator node health`: the health agent's command (registered by node/cli.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from gpu_operator.node.options import HostRoot, host_fs
from gpu_operator.vocabulary import HEALTH_NO_VALIDATIONS, HEALTH_VALIDATIONS

DEFAULT_METRICS_PORT = 8010  # ours (the node-status exporter has 8000)
NO_VALIDATIONS = HEALTH_NO_VALIDATIONS


def _validations(value: str) -> tuple[str, ...]:
    from gpu_operator.node.validate.config import STATUS_FILES

    if value.strip().lower() == NO_VALIDATIONS:  # a pod whose own checks ran first (the DRA validator's)
        return ()
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [n for n in names if n not in STATUS_FILES]
    if unknown:
        raise typer.BadParameter(
            f"--validations: unknown component(s) {', '.join(unknown)}; use a comma-separated list of "
            f"{', '.join(STATUS_FILES)}, or {NO_VALIDATIONS}"
        )
    return names


SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def operator_namespace() -> str:
    """Where the operator's requests Secret is: OPERATOR_NAMESPACE, else the pod's own namespace
    (the agent runs in the operator's namespace)."""
    import os
    from pathlib import Path

    value = os.environ.get("OPERATOR_NAMESPACE", "").strip()
    if value:
        return value
    try:
        return Path(SA_NAMESPACE).read_text().strip()
    except OSError:
        return ""


def health(
    host_root: HostRoot = None,
    node_name: Annotated[
        str,
        typer.Option(
            envvar="NODE_NAME", help="The Node to publish the report on (the downward API's spec.nodeName)."
        ),
    ] = "",
    interval: Annotated[float, typer.Option(help="Seconds between two looks at the host.")] = 10.0,
    once: Annotated[
        bool,
        typer.Option(
            help="Print one report as JSON and exit; nothing is written. It judges the "
            "kernel log's present records too (the agent itself starts at the log's end)."
        ),
    ] = False,
    metrics_port: Annotated[
        int, typer.Option(envvar="HEALTH_METRICS_PORT", help="Port to serve /metrics on (0: none).")
    ] = DEFAULT_METRICS_PORT,
    validations: Annotated[
        str,
        typer.Option(
            envvar="HEALTH_VALIDATIONS",
            help="The validator components whose status files must all be present (`none`: no file).",
        ),
    ] = ",".join(HEALTH_VALIDATIONS),
    nvml: Annotated[bool, typer.Option("--nvml/--no-nvml", help="Use NVML where its library loads.")] = True,
    warning_hold: Annotated[
        float, typer.Option(help="Seconds a GPU stays in `warning` after its last application-level Xid.")
    ] = 600.0,
) -> None:
    """Watch this node's GPUs (kernel log Xids, the PCI bus, the driver's /proc entries, NVML) and
    publish a report in the Node annotation nvidia.com/gpu-health.report when it changes."""
    from gpu_operator.node.health.agent import (
        AnnotationPublisher,
        HealthAgent,
        HealthMetrics,
        install_stop,
        run,
    )

    if interval <= 0:
        raise typer.BadParameter(f"--interval {interval:g}: give a number of seconds above 0")
    components = _validations(validations)
    fs = host_fs(host_root)
    if once:
        agent = HealthAgent(
            fs, node_name, validations=components, nvml=nvml, replay=True, warning_hold=warning_hold
        )
        try:
            typer.echo(json.dumps(agent.observe(), indent=2, sort_keys=True))
        finally:
            agent.close()
        return
    if not node_name:
        raise typer.BadParameter(
            "--node-name (or NODE_NAME) is required to publish; use --once to only print"
        )
    metrics = HealthMetrics()
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="0.0.0.0", registry=metrics.registry)
        typer.echo(f"serving health metrics on :{metrics_port}/metrics", err=True)
    from gpu_operator.node.cluster.kubeapi import RequestWatch, new_client
    from gpu_operator.node.health.agent import _stderr
    from gpu_operator.node.health.requests import RequestActor, smi_resetter

    namespace = operator_namespace()
    client = new_client()
    actor = RequestActor(fs, smi_resetter(fs), log=_stderr)
    agent = HealthAgent(
        fs,
        node_name,
        validations=components,
        nvml=nvml,
        warning_hold=warning_hold,
        metrics=metrics,
        requests=actor,
    )

    async def main() -> None:
        stop = asyncio.Event()
        install_stop(stop)
        # its own client: a watch holds one connection
        watch = RequestWatch(node_name, namespace, log=_stderr) if namespace else None
        if watch is None:
            _stderr(
                "no OPERATOR_NAMESPACE (and no ServiceAccount namespace file): the operator's remediation "
                "requests are not read; the agent only reports"
            )
        await run(agent, AnnotationPublisher(node_name, client), interval, stop, watch)

    asyncio.run(main())
    typer.echo("health agent stopped", err=True)
