"""Commands a person (or the chart's pre-delete hook) runs against a cluster: `upgrade`,
`cleanup`, `must-gather` (registered on the top-level app by gpu_operator.cli). Each reaches the
cluster through kube/reach.py's `run_kube`."""

from __future__ import annotations

from typing import Annotated

import typer

from gpu_operator.kube.options import Kubeconfig


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""
    from gpu_operator.admin import health_cli, upgrade_cli

    upgrade_cli.register(app)
    health_cli.register(app)

    @app.command("cleanup")
    def cleanup(
        kubeconfig: Kubeconfig = None,
        timeout: Annotated[
            float,
            typer.Option(
                help="Seconds to wait for the GPUClusters, NVIDIADrivers and ClusterPolicies to be gone."
            ),
        ] = 120.0,
        crds: Annotated[
            bool, typer.Option("--crds", help="Also delete our CRDs, last (the chart's operator.cleanupCRD).")
        ] = False,
        operator_deployment: Annotated[
            str | None,
            typer.Option(
                "--operator-deployment",
                help="The operator's Deployment in --namespace: scaled to 0 after the "
                "CRs are gone and waited for, so the operator stops (deleting its Lease) while its RBAC still "
                "exists; a Lease left unrenewed is deleted. The chart's hook passes it.",
            ),
        ] = None,
        namespace: Annotated[
            str, typer.Option("--namespace", envvar="OPERATOR_NAMESPACE", help="The operator's namespace.")
        ] = "gpu-operator",
    ) -> None:
        """Before an uninstall: delete every GPUCluster, NVIDIADriver and ClusterPolicy (their
        operands go with them), uncordon the nodes a driver upgrade in progress had cordoned (only
        those), then remove the nvidia.com labels and annotations we wrote from every node; with
        --crds, delete our CRDs too. The operator deletes its Lease when it stops with no
        ClusterPolicy left."""
        from gpu_operator.admin.cleanup import OperatorDeployment
        from gpu_operator.admin.cleanup import cleanup as run_cleanup
        from gpu_operator.kube.reach import run_kube

        where = OperatorDeployment(namespace, operator_deployment) if operator_deployment else None
        try:
            done = run_kube(
                kubeconfig,
                "clean up before an uninstall",
                lambda kube: run_cleanup(kube, timeout=timeout, crds=crds, operator=where),
            )
        except TimeoutError as err:  # the message names what is still there
            typer.secho(f"error: {err}", fg="red", err=True)
            raise typer.Exit(1) from err
        for line in done or ["nothing to clean up"]:
            typer.echo(line)

    @app.command("must-gather")
    def must_gather(
        out: Annotated[
            str | None,
            typer.Option(
                "--out", help="Tarball to write (default: gpu-operator-must-gather-UTCSTAMP.tar.gz here)."
            ),
        ] = None,
        namespace: Annotated[
            str, typer.Option("--namespace", envvar="OPERATOR_NAMESPACE", help="The operator's namespace.")
        ] = "gpu-operator",
        kubeconfig: Kubeconfig = None,
    ) -> None:
        """Collect what a bug report needs into one tarball: ClusterPolicy/NVIDIADriver/GPUCluster
        with status, every object we own, the operator namespace's pods, events and logs (previous
        container too), nodes with our labels and annotations, each GPU node's probe facts and
        findings, versions. Reads only; Secrets appear as names and key names, and credentials
        in any text are replaced. What could not be read is listed in errors.txt."""
        import datetime as dt
        from pathlib import Path

        from gpu_operator.admin.mustgather import gather
        from gpu_operator.kube.reach import load_target, run_kube, unreachable_line

        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        top = f"gpu-operator-must-gather-{stamp}"
        path = Path(out or f"{top}.tar.gz")
        target = load_target(kubeconfig)
        # An apiserver that does not answer at all: nothing to bundle, one line and exit 2.
        bundle = run_kube(target, "collect the support bundle", lambda kube: gather(kube, namespace))
        path.write_bytes(bundle.tarball(top))
        typer.echo(bundle.summary(), err=True)
        typer.echo(str(path))
        if bundle.unanswered:  # it stopped answering half-way: what was read is in the bundle
            typer.secho(
                unreachable_line(target, "collect the rest of the bundle", bundle.unanswered[0])
                + f" ({len(bundle.unanswered)} request(s) got no answer; {path} holds what was read)",
                fg="red",
                err=True,
            )
            raise typer.Exit(1)
