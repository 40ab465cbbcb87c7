"""Commands of the operator area: `run` (registered on the top-level app by gpu_operator.cli)."""

from __future__ import annotations

import os
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    from gpu_operator.controllers import upgrade_cli
    upgrade_cli.register(app)

    @app.command("cleanup")
    def cleanup(
        kubeconfig: Annotated[str | None, typer.Option(
            envvar="KUBECONFIG", help="Kubeconfig file; in-cluster credentials when unset.")] = None,
        timeout: Annotated[float, typer.Option(
            help="Seconds to wait for the GPUClusters, NVIDIADrivers and ClusterPolicies to be gone.")] = 120.0,
        crds: Annotated[bool, typer.Option(
            "--crds", help="Also delete our CRDs, last (the chart's operator.cleanupCRD).")] = False,
        operator_deployment: Annotated[str | None, typer.Option(
            "--operator-deployment", help="The operator's Deployment in --namespace: scaled to 0 after the "
            "CRs are gone and waited for, so the operator stops (deleting its Lease) while its RBAC still "
            "exists; a Lease left unrenewed is deleted. The chart's hook passes it.")] = None,
        namespace: Annotated[str, typer.Option(
            "--namespace", envvar="OPERATOR_NAMESPACE", help="The operator's namespace.")] = "gpu-operator",
    ) -> None:
        """Before an uninstall: delete every GPUCluster, NVIDIADriver and ClusterPolicy (their
        operands go with them), uncordon the nodes a driver upgrade in progress had cordoned (only
        those), then remove the nvidia.com labels and annotations we wrote from every node; with
        --crds, delete our CRDs too. The operator deletes its Lease when it stops with no
        ClusterPolicy left."""
        import asyncio

        from gpu_operator.controllers.cleanup import OperatorDeployment
        from gpu_operator.controllers.cleanup import cleanup as run_cleanup
        from gpu_operator.kube.client import Kube
        from gpu_operator.kube.reach import api_errors, load_target

        target = load_target(kubeconfig)

        async def go() -> list[str]:
            kube = Kube(config=target.config)
            try:
                where = OperatorDeployment(namespace, operator_deployment) if operator_deployment else None
                return await run_cleanup(kube, timeout=timeout, crds=crds, operator=where)
            finally:
                await kube.close()

        with api_errors(target, "clean up before an uninstall"):
            try:
                done = asyncio.run(go())
            except TimeoutError as err:  # the message names what is still there
                typer.secho(f"error: {err}", fg="red", err=True)
                raise typer.Exit(1) from err
        for line in done or ["nothing to clean up"]:
            typer.echo(line)

    @app.command("must-gather")
    def must_gather(
        out: Annotated[str | None, typer.Option(
            "--out", help="Tarball to write (default: gpu-operator-must-gather-UTCSTAMP.tar.gz here).")] = None,
        namespace: Annotated[str, typer.Option(
            "--namespace", envvar="OPERATOR_NAMESPACE", help="The operator's namespace.")] = "gpu-operator",
        kubeconfig: Annotated[str | None, typer.Option(
            envvar="KUBECONFIG", help="Kubeconfig file; in-cluster credentials when unset.")] = None,
    ) -> None:
        """Collect what a bug report needs into one tarball: ClusterPolicy/NVIDIADriver/GPUCluster
        with status, every object we own, the operator namespace's pods, events and logs (previous
        container too), nodes with our labels and annotations, each GPU node's probe facts and
        findings, versions. Reads only; Secrets appear as names and key names, and credentials
        in any text are replaced. What could not be read is listed in errors.txt."""
        import asyncio
        import datetime as dt
        from pathlib import Path

        from gpu_operator.controllers.mustgather import Bundle, gather
        from gpu_operator.kube.client import Kube
        from gpu_operator.kube.reach import api_errors, load_target, unreachable_line

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        top = f"gpu-operator-must-gather-{stamp}"
        path = Path(out or f"{top}.tar.gz")
        target = load_target(kubeconfig)

        async def go() -> Bundle:
            kube = Kube(config=target.config)
            try:
                return await gather(kube, namespace)
            finally:
                await kube.close()

        # An apiserver that does not answer at all: nothing to bundle, one line and exit 2.
        with api_errors(target, "collect the support bundle"):
            bundle = asyncio.run(go())
        path.write_bytes(bundle.tarball(top))
        typer.echo(bundle.summary(), err=True)
        typer.echo(str(path))
        if bundle.unanswered:  # it stopped answering half-way: what was read is in the bundle
            typer.secho(unreachable_line(target, "collect the rest of the bundle", bundle.unanswered[0])
                        + f" ({len(bundle.unanswered)} request(s) got no answer; {path} holds what was read)",
                        fg="red", err=True)
            raise typer.Exit(1)

    @app.command("run")
    def run(
        namespace: Annotated[str, typer.Option(
            "--namespace", envvar="OPERATOR_NAMESPACE",
            help="Namespace of the operator and its operands (env OPERATOR_NAMESPACE).")] = "",
        kubeconfig: Annotated[str | None, typer.Option(
            envvar="KUBECONFIG", help="Kubeconfig file; in-cluster credentials when unset.")] = None,
        leader_elect: Annotated[bool, typer.Option(
            "--leader-elect/--no-leader-elect",
            help="Take the Lease 53822513.nvidia.com before writing anything (run >1 replica).")] = False,
        metrics_bind_address: Annotated[str, typer.Option(
            help="Where /metrics listens; 0 turns it off.")] = ":8080",
        health_probe_bind_address: Annotated[str, typer.Option(
            help="Where /healthz and /readyz listen; 0 turns them off.")] = ":8081",
        leader_lease_renew_deadline: Annotated[float, typer.Option(
            help="Seconds a leader may fail to renew before it steps down; the lease lasts 5 s more.")] = 10.0,
        label_concurrency: Annotated[int, typer.Option(
            help="Node label patches in flight at once.")] = 32,
        gfd_node_labels: Annotated[bool, typer.Option(
            "--gfd-node-labels/--no-gfd-node-labels",
            help="Put GPU feature discovery's nvidia.com/ labels (its NodeFeature objects) on the Nodes, "
                 "as NFD's master would; turn off where NFD runs (the chart does, with nfd.enabled=false).")] = True,
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    ) -> None:
        """Run the operator: reconcile ClusterPolicy, label GPU nodes, serve metrics and probes."""
        import asyncio
        import logging

        from gpu_operator.controllers.run import run as run_operator
        from gpu_operator.controllers.settings import OperatorSettings

        if log_level.lower() not in ("debug", "info", "warning", "error"):
            raise typer.BadParameter(f"{log_level!r}: use debug, info, warning or error", param_hint="--log-level")
        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("kopf", "httpx", "httpx2", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        if not namespace:
            raise typer.BadParameter("set --namespace or OPERATOR_NAMESPACE: the namespace the operator and "
                                     "its operands run in, e.g. --namespace gpu-operator", param_hint="--namespace")
        os.environ["OPERATOR_NAMESPACE"] = namespace
        from gpu_operator import __version__
        from gpu_operator.render.defaults import missing_images
        log = logging.getLogger("gpu_operator")
        log.info("gpu-operator %s: namespace %s, log level %s, leader election %s",
                 __version__, namespace, log_level.lower(), "on" if leader_elect else "off")
        if defaults := missing_images(os.environ):
            # the chart's Deployment sets every one of them; run by hand, the same values apply
            os.environ.update(defaults)
            log.info("image variables not set, using the chart's defaults (render/defaults.py, the images its "
                     "values.yaml names; set one to \"\" for no fallback): %s",
                     ", ".join(f"{k}={v}" for k, v in defaults.items()))
        settings = OperatorSettings.with_renew_deadline(leader_lease_renew_deadline,
                                                        label_concurrency=label_concurrency,
                                                        gfd_node_labels=gfd_node_labels)
        code = asyncio.run(run_operator(
            namespace, kubeconfig, leader_elect, metrics_bind_address, health_probe_bind_address, settings))
        raise typer.Exit(code)
