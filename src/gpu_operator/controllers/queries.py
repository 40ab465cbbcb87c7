"""The queries every unit shares over the caches' views: which ClusterPolicy is active, which
NVIDIADrivers are valid, which driver owns which node. Pure (no I/O): the read model
(controllers/readmodel.py) answers them for the units, and units never import each other for them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pydantic

from gpu_operator.api.nvidiadriver import NVIDIADriver, NVIDIADriverUpgradePolicy
from gpu_operator.controllers.views import ClusterPolicyView, DriverPodView, NodeView, NVIDIADriverView
from gpu_operator.render.driverowners import Routing, route
from gpu_operator.vocabulary import DRIVER_OWNER


@dataclass(frozen=True)
class NodeDriver:
    """What the NVIDIADrivers say about one GPU node (see gpu_operator.render.driverowners)."""

    owner: str | None = None  # the owning NVIDIADriver; None: no NVIDIADriver claims the node
    conflict: bool = False  # two NVIDIADrivers claim it: owner label and annotation stay as they are
    auto_upgrade: bool = True  # the owner's spec.upgradePolicy.autoUpgrade (default true)
    orphaned_driver_pod: bool = False  # a running driver pod no DaemonSet owns (left by a switch)


def active_policy(policies: Iterable[ClusterPolicyView]) -> ClusterPolicyView | None:
    """The singleton rule: the oldest ClusterPolicy (name breaks ties) is the active one."""
    ordered = sorted(policies, key=lambda p: (p.created, p.name))
    return ordered[0] if ordered else None


def validation_message(err: pydantic.ValidationError, owner: str = "the ClusterPolicy") -> str:
    """The first invalid field, what is wrong with it and where to fix it."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {message} (fix the field in {owner})"


def parse_drivers(views: Iterable[NVIDIADriverView]) -> tuple[dict[str, NVIDIADriver], dict[str, str]]:
    """Valid NVIDIADrivers by name (those being deleted left out) and the invalid ones' errors."""
    valid: dict[str, NVIDIADriver] = {}
    errors: dict[str, str] = {}
    for view in views:
        if view.deleting:
            continue
        parsed = view.parsed
        if parsed.error is not None:
            errors[view.name] = validation_message(parsed.error, f"NVIDIADriver {view.name}")
        else:
            valid[view.name] = parsed.valid()
    return valid, errors


def routing_of(drivers: Iterable[NVIDIADriver], nodes: Iterable[NodeView]) -> Routing:
    return route(drivers, {n.name: n.selectable for n in nodes if n.gpu_present})


def effective_owners(routing: Routing, nodes: Iterable[NodeView]) -> dict[str, str]:
    """Owners to render for: the routing, and for a conflicting node its current owner label (so a
    conflict takes nothing away from the NVIDIADriver that had the node)."""
    owners = dict(routing.owners)
    labels = {n.name: n.labels for n in nodes}
    for node in routing.conflicts:
        current = labels.get(node, {}).get(DRIVER_OWNER)
        if current:
            owners[node] = current
    return owners


def node_drivers(
    drivers: Iterable[NVIDIADriver], nodes: Iterable[NodeView], pods: Iterable[DriverPodView]
) -> dict[str, NodeDriver]:
    """Per GPU node, what node labelling needs: owner, conflict, owner's auto-upgrade, orphaned pod."""
    by_name = {d.metadata.name: d for d in drivers}
    nodes = list(nodes)
    routing = routing_of(by_name.values(), nodes)
    orphaned = {p.node for p in pods if p.orphaned and p.running}
    out: dict[str, NodeDriver] = {}
    for node in nodes:
        if not node.gpu_present:
            continue
        owner = routing.owners.get(node.name)
        policy = by_name[owner].spec.upgradePolicy if owner else None
        out[node.name] = NodeDriver(
            owner=owner,
            conflict=node.name in routing.conflicts,
            auto_upgrade=policy.autoUpgrade if policy else True,
            orphaned_driver_pod=node.name in orphaned,
        )
    return out


@dataclass(frozen=True)
class UpgradeGroup:
    """The nodes one NVIDIADriver owns and the upgrade policy that applies to them: the unit the
    driver upgrade state machine runs on, once per owner CR (upstream partitions its cluster
    state by the owner label and applies each CR's policy)."""

    owner: str
    policy: NVIDIADriverUpgradePolicy
    nodes: tuple[str, ...]


def upgrade_groups(drivers: Iterable[NVIDIADriver], nodes: Iterable[NodeView]) -> list[UpgradeGroup]:
    """Per NVIDIADriver, its nodes (by the owner label node labelling wrote) and its policy
    (upstream's defaults, auto-upgrade on, when the CR sets none)."""
    owned: dict[str, list[str]] = {}
    for node in nodes:
        owner = node.labels.get(DRIVER_OWNER)
        if owner:
            owned.setdefault(owner, []).append(node.name)
    return [
        UpgradeGroup(
            d.metadata.name,
            d.spec.upgradePolicy or NVIDIADriverUpgradePolicy(),
            tuple(sorted(owned.get(d.metadata.name, []))),
        )
        for d in sorted(drivers, key=lambda d: d.metadata.name)
    ]
