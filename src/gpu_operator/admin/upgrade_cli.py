"""`gpu-operator upgrade status|retry NODE|pause|resume`: driver upgrades from the command line.

Pause is stored as the annotation nvidia.com/gpu-driver-upgrade-paused=true on the owner of the
driver pods: the active ClusterPolicy, or with `driver.useNvidiaDriverCRD` each NVIDIADriver (one
with `--nvidiadriver NAME`). While it is set, none of that owner's nodes leaves upgrade-required;
nodes in flight finish."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
import typer

from gpu_operator.kube.options import Kubeconfig
from gpu_operator.vocabulary import UPGRADE_DONE, UPGRADE_FAILED, UPGRADE_PAUSED_ANNOTATION

if TYPE_CHECKING:
    from gpu_operator.kube.client import Kube

OnlyDriver = Annotated[
    str | None,
    typer.Option(
        "--nvidiadriver",
        metavar="NAME",
        help="Only this NVIDIADriver's nodes. Without it: every NVIDIADriver when the ClusterPolicy has "
        "driver.useNvidiaDriverCRD=true (each has its own upgradePolicy), else the ClusterPolicy.",
    ),
]
CLUSTER_POLICY, NVIDIA_DRIVER = "ClusterPolicy", "NVIDIADriver"


CLUSTER_POLICY_API, NVIDIA_DRIVER_API = "nvidia.com/v1", "nvidia.com/v1alpha1"


async def _active_policy(kube: Kube) -> dict[str, Any]:
    """The active ClusterPolicy's body, by the operator's own rule (controllers/queries.py)."""
    from gpu_operator.controllers.queries import active_policy
    from gpu_operator.controllers.views import ClusterPolicyView

    active = active_policy(
        ClusterPolicyView.of(p) for p in await kube.list_dicts(CLUSTER_POLICY_API, CLUSTER_POLICY)
    )
    if active is None:
        typer.echo(
            "no ClusterPolicy: driver upgrades follow ClusterPolicy spec.driver.upgradePolicy; create one",
            err=True,
        )
        raise typer.Exit(2)
    return active.body


async def _drivers(kube: Kube) -> list[dict[str, Any]]:
    return sorted(
        await kube.list_dicts(NVIDIA_DRIVER_API, NVIDIA_DRIVER), key=lambda d: d["metadata"]["name"]
    )


def uses_nvidia_drivers(policy: Mapping[str, Any]) -> bool:
    """`driver.useNvidiaDriverCRD` as the operator reads it: through the api model. A policy the
    model refuses routes no node to an NVIDIADriver (the operator then upgrades nothing either)."""
    from gpu_operator.api.clusterpolicy import ClusterPolicy

    try:
        return bool(ClusterPolicy.model_validate(policy).spec.driver.useNvidiaDriverCRD)
    except pydantic.ValidationError:
        return False


def pause_targets(
    policy: Mapping[str, Any] | None, drivers: Sequence[Mapping[str, Any]], only: str | None
) -> list[tuple[str, str]]:
    """(kind, name) of the objects pause/resume annotates: the NVIDIADriver named by
    `--nvidiadriver`, else the owners of the driver pods (every NVIDIADriver with the CRD in use,
    else the active ClusterPolicy). LookupError names what is missing."""
    names = [d["metadata"]["name"] for d in drivers]
    if only is not None:
        if only not in names:
            raise LookupError(f"no NVIDIADriver {only} (there are: {', '.join(names) or 'none'})")
        return [(NVIDIA_DRIVER, only)]
    if policy is None:
        raise LookupError("no ClusterPolicy")
    if not uses_nvidia_drivers(policy):
        return [(CLUSTER_POLICY, policy["metadata"]["name"])]
    if not names:
        raise LookupError(
            "the ClusterPolicy uses NVIDIADrivers (driver.useNvidiaDriverCRD) but there is none"
        )
    return [(NVIDIA_DRIVER, name) for name in names]


def policy_line(kind: str, body: Mapping[str, Any]) -> str:
    """One owner's upgradePolicy as `upgrade status` prints it (the api model's defaults: an
    NVIDIADriver's autoUpgrade is on when unset, the ClusterPolicy's off)."""
    from gpu_operator.api.common import DriverUpgradePolicySpec
    from gpu_operator.api.nvidiadriver import NVIDIADriverUpgradePolicy
    from gpu_operator.statusview.upgrades import paused

    name, spec = body["metadata"]["name"], body.get("spec") or {}
    raw = ((spec.get("driver") or {}) if kind == CLUSTER_POLICY else spec).get("upgradePolicy") or {}
    model = NVIDIADriverUpgradePolicy if kind == NVIDIA_DRIVER else DriverUpgradePolicySpec
    try:
        policy = model.model_validate(raw)
        text = (
            f"autoUpgrade={policy.autoUpgrade} maxParallelUpgrades={policy.maxParallelUpgrades} "
            f"maxUnavailable={policy.maxUnavailable}"
        )
    except pydantic.ValidationError:
        text = f"upgradePolicy not valid: {raw}"
    if paused(dict(body)):
        text += f"  PAUSED (gpu-operator upgrade resume{f' --nvidiadriver {name}' if kind == NVIDIA_DRIVER else ''})"
    return f"{kind} {name}: {text}"


async def _set_paused(kube: Kube, only: str | None, value: str | None) -> list[tuple[str, str]]:
    try:
        targets = pause_targets(None if only else await _active_policy(kube), await _drivers(kube), only)
    except LookupError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from err
    patch = {"metadata": {"annotations": {UPGRADE_PAUSED_ANNOTATION: value}}}
    for kind, name in targets:
        await kube.merge_patch(
            NVIDIA_DRIVER_API if kind == NVIDIA_DRIVER else CLUSTER_POLICY_API, kind, name, patch
        )
    return targets


@dataclass(frozen=True)
class _Reading:
    policy: dict[str, Any]
    nodes: list[dict[str, Any]]
    drivers: list[dict[str, Any]]


async def _read(kube: Kube) -> _Reading:
    policy = await _active_policy(kube)
    nodes = await kube.list_dicts("v1", "Node")
    return _Reading(policy, nodes, await _drivers(kube) if uses_nvidia_drivers(policy) else [])


async def _retry(kube: Kube, node: str) -> None:
    from gpu_operator.controllers.units.upgrade.state import retry_patch
    from gpu_operator.kube.reach import node_or_exit

    current = await node_or_exit(kube, node)
    await kube.merge_patch(
        "v1", "Node", node, retry_patch(dict(current["metadata"].get("annotations") or {}))
    )


def register(app: typer.Typer) -> None:
    upgrade = typer.Typer(
        help="Driver upgrades: per-node state, retry a failed node, pause and resume.", no_args_is_help=True
    )
    app.add_typer(upgrade, name="upgrade")

    @upgrade.command("status")
    def status(kubeconfig: Kubeconfig = None) -> None:
        """Each node's upgrade state, time in state and, for failed nodes, why."""
        from gpu_operator.kube.reach import run_kube
        from gpu_operator.statusview.upgrades import node_upgrade, summary
        from gpu_operator.vocabulary import DRIVER_OWNER

        reading = run_kube(kubeconfig, "read the driver upgrade state", _read)
        policy, nodes, drivers = reading.policy, reading.nodes, reading.drivers
        rows = [r for r in (node_upgrade(n) for n in nodes) if r.state]
        owners: dict[str, str] = {}
        if uses_nvidia_drivers(policy):
            typer.echo(
                f"ClusterPolicy {policy['metadata']['name']}: driver.useNvidiaDriverCRD=true, each "
                "NVIDIADriver's upgradePolicy applies to its nodes"
            )
            for driver in drivers:
                typer.echo(policy_line(NVIDIA_DRIVER, driver))
            owners = {
                n["metadata"]["name"]: f"  ({NVIDIA_DRIVER} {owner})"
                for n in nodes
                if (owner := (n["metadata"].get("labels") or {}).get(DRIVER_OWNER))
            }
        else:
            typer.echo(policy_line(CLUSTER_POLICY, policy))
        typer.echo(summary(rows))
        for row in sorted(rows, key=lambda r: (r.state == UPGRADE_DONE, r.node)):
            line = f"  {row.node:<32} {row.text}{owners.get(row.node, '')}"
            if row.reason:
                line += f"  reason: {row.reason}"
            typer.echo(line)
        raise typer.Exit(1 if any(r.state == UPGRADE_FAILED for r in rows) else 0)

    @upgrade.command("retry")
    def retry(
        node: Annotated[str, typer.Argument(help="Node in upgrade-failed (or stuck) to start over.")],
        kubeconfig: Kubeconfig = None,
    ) -> None:
        """Put NODE back to upgrade-required, its failure reason and timers cleared."""
        from gpu_operator.kube.reach import run_kube

        run_kube(kubeconfig, f"put Node {node} back to upgrade-required", lambda kube: _retry(kube, node))
        typer.echo(f"Node {node}: back to upgrade-required")

    @upgrade.command("pause")
    def pause(nvidiadriver: OnlyDriver = None, kubeconfig: Kubeconfig = None) -> None:
        """No new node starts upgrading; nodes already in flight finish. Sets the annotation
        nvidia.com/gpu-driver-upgrade-paused=true on the ClusterPolicy or, when it has
        driver.useNvidiaDriverCRD=true, on every NVIDIADriver (or only --nvidiadriver NAME)."""
        from gpu_operator.kube.reach import run_kube

        targets = run_kube(
            kubeconfig, "pause driver upgrades", lambda kube: _set_paused(kube, nvidiadriver, "true")
        )
        for kind, name in targets:
            typer.echo(f"{kind} {name}: driver upgrades paused")

    @upgrade.command("resume")
    def resume(nvidiadriver: OnlyDriver = None, kubeconfig: Kubeconfig = None) -> None:
        """Let nodes start upgrading again (removes the annotation pause set, from the same objects)."""
        from gpu_operator.kube.reach import run_kube

        targets = run_kube(
            kubeconfig, "resume driver upgrades", lambda kube: _set_paused(kube, nvidiadriver, None)
        )
        for kind, name in targets:
            typer.echo(f"{kind} {name}: driver upgrades resumed")
