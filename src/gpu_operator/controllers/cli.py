"""Commands of the operator area: `run` (registered on the top-level app by gpu_operator.cli).
The commands a person runs against a cluster are in admin/."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from gpu_operator.controllers.settings import Backoff, OperatorSettings
from gpu_operator.kube.options import Kubeconfig

DEFAULTS = OperatorSettings()


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""

    @app.command("run")
    def run(
        namespace: Annotated[
            str,
            typer.Option(
                "--namespace",
                envvar="OPERATOR_NAMESPACE",
                help="Namespace of the operator and its operands (env OPERATOR_NAMESPACE).",
            ),
        ] = "",
        kubeconfig: Kubeconfig = None,
        leader_elect: Annotated[
            bool,
            typer.Option(
                "--leader-elect/--no-leader-elect",
                help="Take the Lease 53822513.nvidia.com before writing anything (run >1 replica).",
            ),
        ] = False,
        metrics_bind_address: Annotated[
            str, typer.Option(help="Where /metrics listens; 0 turns it off.")
        ] = ":8080",
        health_probe_bind_address: Annotated[
            str, typer.Option(help="Where /healthz and /readyz listen; 0 turns them off.")
        ] = ":8081",
        leader_lease_renew_deadline: Annotated[
            float,
            typer.Option(
                help="Seconds a leader may fail to renew before it steps down; the lease lasts 5 s more."
            ),
        ] = DEFAULTS.leader_renew_deadline,
        label_concurrency: Annotated[
            int, typer.Option(help="Node label patches in flight at once.")
        ] = DEFAULTS.label_concurrency,
        gfd_node_labels: Annotated[
            bool,
            typer.Option(
                "--gfd-node-labels/--no-gfd-node-labels",
                help="Put GPU feature discovery's nvidia.com/ labels (its NodeFeature objects) on the Nodes, "
                "as NFD's master would; turn off where NFD runs (the chart does, with nfd.enabled=false).",
            ),
        ] = DEFAULTS.gfd_node_labels,
        mig_change_budget: Annotated[
            float,
            typer.Option(
                help="Seconds a node's MIG change may stay pending before its paused GPU clients are restored "
                "and the change is retried; keep it above the MIG manager's 5-minute wait."
            ),
        ] = DEFAULTS.mig_change_budget,
        mig_retry_after: Annotated[
            float,
            typer.Option(
                help="Seconds before the first retry of a stuck or failed MIG change (doubling per retry)."
            ),
        ] = DEFAULTS.mig_retry_backoff.initial,
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    ) -> None:
        """Run the operator: reconcile ClusterPolicy, label GPU nodes, serve metrics and probes."""
        import asyncio
        import logging

        from gpu_operator.controllers.environment import Environment
        from gpu_operator.controllers.run import run as run_operator

        if log_level.lower() not in ("debug", "info", "warning", "error"):
            raise typer.BadParameter(
                f"{log_level!r}: use debug, info, warning or error", param_hint="--log-level"
            )
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("kopf", "httpx", "httpx2", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        if not namespace:
            raise typer.BadParameter(
                "set --namespace or OPERATOR_NAMESPACE: the namespace the operator and "
                "its operands run in, e.g. --namespace gpu-operator",
                param_hint="--namespace",
            )
        from gpu_operator import __version__
        from gpu_operator.render.defaults import missing_images

        log = logging.getLogger("gpu_operator")
        log.info(
            "gpu-operator %s: namespace %s, log level %s, leader election %s",
            __version__,
            namespace,
            log_level.lower(),
            "on" if leader_elect else "off",
        )
        if defaults := missing_images(os.environ):
            # the chart's Deployment sets every one of them; run by hand, the same values apply
            log.info(
                "image variables not set, using the chart's defaults (render/defaults.py, the images its "
                'values.yaml names; set one to "" for no fallback): %s',
                ", ".join(f"{k}={v}" for k, v in defaults.items()),
            )
        for value, hint in (
            (mig_change_budget, "--mig-change-budget"),
            (mig_retry_after, "--mig-retry-after"),
        ):
            if value <= 0:
                raise typer.BadParameter(f"{value:g}: give a number of seconds above 0", param_hint=hint)
        settings = OperatorSettings.with_renew_deadline(
            leader_lease_renew_deadline,
            label_concurrency=label_concurrency,
            gfd_node_labels=gfd_node_labels,
            mig_change_budget=mig_change_budget,
            mig_retry_backoff=Backoff(
                initial=mig_retry_after, cap=max(mig_retry_after, DEFAULTS.mig_retry_backoff.cap)
            ),
        )
        # the environment is read here, once: the units are handed what it says
        environment = Environment.of({**os.environ, **defaults, "OPERATOR_NAMESPACE": namespace})
        code = asyncio.run(
            run_operator(
                environment,
                kubeconfig,
                leader_elect,
                metrics_bind_address,
                health_probe_bind_address,
                settings,
            )
        )
        raise typer.Exit(code)
