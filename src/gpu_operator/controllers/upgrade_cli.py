"""`gpu-operator upgrade status|retry NODE|pause|resume`: driver upgrades from the command line.

Pause is stored as the annotation nvidia.com/gpu-driver-upgrade-paused=true on the active
ClusterPolicy: while it is set, no node leaves upgrade-required; nodes in flight finish."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpu_operator.vocabulary import UPGRADE_PAUSED_ANNOTATION

Kubeconfig = Annotated[str | None, typer.Option(
    envvar="KUBECONFIG", help="Kubeconfig file; in-cluster credentials when unset.")]


def _client(kubeconfig: str | None) -> Any:
    from lightkube import Client

    from gpu_operator.kube.client import load_config
    return Client(load_config(kubeconfig))


def _active_policy(client: Any) -> dict[str, Any]:
    from gpu_operator.kube.client import ClusterPolicyResource
    policies = sorted((p.to_dict() if hasattr(p, "to_dict") else dict(p) for p in client.list(ClusterPolicyResource)),
                      key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
    if not policies:
        typer.echo("no ClusterPolicy: driver upgrades follow ClusterPolicy spec.driver.upgradePolicy; create one",
                   err=True)
        raise typer.Exit(2)
    return policies[0]


def _set_paused(kubeconfig: str | None, value: str | None) -> str:
    from lightkube.types import PatchType

    from gpu_operator.kube.client import ClusterPolicyResource
    client = _client(kubeconfig)
    name = _active_policy(client)["metadata"]["name"]
    client.patch(ClusterPolicyResource, name, {"metadata": {"annotations": {UPGRADE_PAUSED_ANNOTATION: value}}},
                 patch_type=PatchType.MERGE)
    return str(name)


def register(app: typer.Typer) -> None:
    upgrade = typer.Typer(help="Driver upgrades: per-node state, retry a failed node, pause and resume.",
                          no_args_is_help=True)
    app.add_typer(upgrade, name="upgrade")

    @upgrade.command("status")
    def status(kubeconfig: Kubeconfig = None) -> None:
        """Each node's upgrade state, time in state and, for failed nodes, why."""
        from lightkube.resources.core_v1 import Node

        from gpu_operator.statusview.upgrades import node_upgrade, paused, summary
        client = _client(kubeconfig)
        policy = _active_policy(client)
        spec = ((policy.get("spec") or {}).get("driver") or {}).get("upgradePolicy") or {}
        rows = [node_upgrade(n.to_dict()) for n in client.list(Node)]
        rows = [r for r in rows if r.state]
        typer.echo(f"ClusterPolicy {policy['metadata']['name']}: autoUpgrade={bool(spec.get('autoUpgrade'))} "
                   f"maxParallelUpgrades={spec.get('maxParallelUpgrades', 1)} "
                   f"maxUnavailable={spec.get('maxUnavailable', '25%')}"
                   f"{'  PAUSED (gpu-operator upgrade resume)' if paused(policy) else ''}")
        typer.echo(summary(rows))
        for row in sorted(rows, key=lambda r: (r.state == "upgrade-done", r.node)):
            line = f"  {row.node:<32} {row.text}"
            if row.reason:
                line += f"  reason: {row.reason}"
            typer.echo(line)
        raise typer.Exit(1 if any(r.state == "upgrade-failed" for r in rows) else 0)

    @upgrade.command("retry")
    def retry(node: Annotated[str, typer.Argument(help="Node in upgrade-failed (or stuck) to start over.")],
              kubeconfig: Kubeconfig = None) -> None:
        """Put NODE back to upgrade-required, its failure reason and timers cleared."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        from gpu_operator.controllers.upgrade_state import retry_patch
        client = _client(kubeconfig)
        try:
            current = client.get(Node, node)
        except ApiError as err:
            typer.echo(f"Node {node}: {err.status.message}", err=True)
            raise typer.Exit(2) from err
        client.patch(Node, node, retry_patch(dict(current.metadata.annotations or {})), patch_type=PatchType.MERGE)
        typer.echo(f"Node {node}: back to upgrade-required")

    @upgrade.command("pause")
    def pause(kubeconfig: Kubeconfig = None) -> None:
        """No new node starts upgrading; nodes already in flight finish."""
        typer.echo(f"ClusterPolicy {_set_paused(kubeconfig, 'true')}: driver upgrades paused")

    @upgrade.command("resume")
    def resume(kubeconfig: Kubeconfig = None) -> None:
        """Let nodes start upgrading again."""
        typer.echo(f"ClusterPolicy {_set_paused(kubeconfig, None)}: driver upgrades resumed")
