"""`gpu-operator health status|retry NODE|hold NODE`: GPU health and remediation from the command
line. Reads the Nodes (the condition, state label and annotations the operator writes); retry and
hold write the node's state label as the operator's remediation machine reads it
(controllers/units/health/machine.py), so the operator resumes from there."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpu_operator.kube.options import Kubeconfig

if TYPE_CHECKING:
    from gpu_operator.kube.client import Kube


async def _nodes(kube: Kube) -> list[dict[str, Any]]:
    return sorted(await kube.list_dicts("v1", "Node"), key=lambda n: n["metadata"]["name"])


async def _retry(kube: Kube, node: str) -> None:
    from gpu_operator.controllers.units.health.machine import retry_patch
    from gpu_operator.kube.reach import node_or_exit

    body = await node_or_exit(kube, node)
    await kube.merge_patch("v1", "Node", node, retry_patch(body["metadata"].get("annotations") or {}))


async def _hold(kube: Kube, node: str, reason: str) -> None:
    from gpu_operator.controllers.units.health.machine import hold_patch
    from gpu_operator.kube.reach import node_or_exit

    await node_or_exit(kube, node)
    await kube.merge_patch("v1", "Node", node, hold_patch(reason, time.time()))


def register(app: typer.Typer) -> None:
    health = typer.Typer(
        help="GPU health: per-node condition and remediation state, retry, hold.", no_args_is_help=True
    )
    app.add_typer(health, name="health")

    @health.command("status")
    def status(kubeconfig: Kubeconfig = None) -> None:
        """Each GPU node's NvidiaGPUReady condition and remediation state; exit 1 when a node is
        quarantined, failed or held."""
        from gpu_operator.kube.reach import run_kube
        from gpu_operator.statusview.health import node_health, problems

        nodes = run_kube(kubeconfig, "read the GPU health of the nodes", _nodes)
        rows = [r for r in (node_health(n) for n in nodes) if r.ready or r.remediation]
        if not rows:
            typer.echo("no node carries a GPU health condition yet (the health agent reports per GPU node)")
            return
        for row in sorted(rows, key=lambda r: (r.ready == "True", r.node)):
            line = f"  {row.node:<32} {row.text or row.reason:<28} {row.message}"
            if row.attempts:
                line += f"  attempts: {row.attempts}"
            if row.why:
                line += f"  reason: {row.why}"
            typer.echo(line.rstrip())
        for problem in problems(rows):
            typer.echo(problem)
        raise typer.Exit(1 if any(r.tainted or r.remediation for r in rows) else 0)

    @health.command("retry")
    def retry(
        node: Annotated[str, typer.Argument(help="Node whose remediation failed or is held.")],
        kubeconfig: Kubeconfig = None,
    ) -> None:
        """Put NODE back to quarantined, its attempts, reason and flapping record cleared: the
        operator remediates it again (when spec.health.remediation.enabled)."""
        from gpu_operator.kube.reach import run_kube

        run_kube(kubeconfig, f"put Node {node} back to quarantined", lambda kube: _retry(kube, node))
        typer.echo(f"Node {node}: back to quarantined")

    @health.command("hold")
    def hold(
        node: Annotated[str, typer.Argument(help="Node to keep quarantined, out of remediation.")],
        reason: Annotated[
            str, typer.Option(help="Why (shown in the condition and status).")
        ] = "held by hand",
        kubeconfig: Kubeconfig = None,
    ) -> None:
        """Hold NODE: it stays quarantined (tainted) and remediation leaves it alone until
        `gpu-operator health retry NODE`."""
        from gpu_operator.kube.reach import run_kube

        run_kube(kubeconfig, f"hold Node {node}", lambda kube: _hold(kube, node, reason))
        typer.echo(f"Node {node}: held ({reason})")
