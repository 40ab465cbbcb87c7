"""Commands of the statusview area: `status` (registered on the top-level app by gpu_operator.cli)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpu_operator.kube.options import Kubeconfig


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""

    @app.command("status")
    def status(
        kubeconfig: Kubeconfig = None,
        namespace: Annotated[
            str | None,
            typer.Option(
                "--namespace", "-n", help="Operand namespace; default: the ClusterPolicy's status.namespace."
            ),
        ] = None,
        max_nodes: Annotated[int, typer.Option(help="Rows to show (not-ready nodes first).")] = 40,
    ) -> None:
        """GPU nodes x components (deploy label, operand pod phase, validation), the ClusterPolicy
        state and the reason for anything not ready. Exit code 0 when everything is ready, 1 if not."""
        from gpu_operator.kube.reach import sync_client
        from gpu_operator.statusview.collect import collect
        from gpu_operator.statusview.render import make_console, render_view

        with sync_client(
            kubeconfig,
            "read the GPU nodes and the ClusterPolicy",
            needs="the status view needs get/list on nodes, daemonsets, pods, clusterpolicies",
        ) as client:
            view = collect(client, namespace)
        make_console().print(render_view(view, max_nodes=max_nodes))
        raise typer.Exit(0 if view.ready else 1)
