"""Whose upgradePolicy applies to which nodes, pure: the ClusterPolicy for every node, or, with
`driver.useNvidiaDriverCRD`, each NVIDIADriver for the nodes it owns (the owner label node
labelling writes). The upgrade controller runs the state machine once per owner."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.controllers.queries import parse_drivers, upgrade_groups
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.controllers.views import ClusterPolicyView, NodeView, NVIDIADriverView
from gpu_operator.vocabulary import UPGRADE_PAUSED_ANNOTATION


@dataclass(frozen=True)
class Owner:
    """Whose upgradePolicy applies to which driver pods: the ClusterPolicy, or one NVIDIADriver."""

    name: str
    policy: us.Policy
    paused: bool
    owner_uid: str  # driver DaemonSets owned by this object are the ones considered
    # The nodes this owner's pass may count, plan and relabel; None: every node (the ClusterPolicy).
    nodes: frozenset[str] | None = None

    def scope(self, views: Mapping[str, NodeView]) -> dict[str, NodeView]:
        """The views of this owner's nodes (a node of another owner is never in them)."""
        if self.nodes is None:
            return dict(views)
        return {name: view for name, view in views.items() if name in self.nodes}


def owner_of(body: Mapping[str, Any], policy: us.Policy) -> Owner:
    meta = body.get("metadata") or {}
    paused = (meta.get("annotations") or {}).get(UPGRADE_PAUSED_ANNOTATION) == "true"
    return Owner(meta.get("name", ""), policy, paused, meta.get("uid", ""))


def clusterpolicy_owner(view: ClusterPolicyView) -> Owner | None:
    """The ClusterPolicy as the owner of its driver pods, its upgradePolicy read through the api
    model (ClusterPolicySpec.driver_upgrade_policy: off with the driver disabled or sandbox
    workloads on); None when the model rejects it (its status names the field)."""
    model = view.parsed.model
    return None if model is None else owner_of(view.body, us.Policy.of(model.spec.driver_upgrade_policy()))


def nvidiadriver_owners(drivers: Iterable[NVIDIADriverView], nodes: Iterable[NodeView]) -> list[Owner]:
    """One owner per valid NVIDIADriver (those being deleted or rejected by the api model own
    nothing): its own upgradePolicy (api/nvidiadriver.py: autoUpgrade on when unset), its pause
    annotation, and the nodes carrying its owner label."""
    views = list(drivers)
    valid, _ = parse_drivers(views)
    bodies = {v.name: v.body for v in views}
    return [
        dataclasses.replace(
            owner_of(bodies[group.owner], us.Policy.of(group.policy)), nodes=frozenset(group.nodes)
        )
        for group in upgrade_groups(valid.values(), nodes)
    ]


def upgrade_owners(
    active: ClusterPolicyView | None,
    drivers: Iterable[NVIDIADriverView],
    nodes: Iterable[NodeView],
    dra: bool = False,
) -> list[Owner]:
    """The owners one upgrade pass runs for: none without a ClusterPolicy (or with one the api
    model rejects), the ClusterPolicy, or with `driver.useNvidiaDriverCRD` every NVIDIADriver; with
    `dra` (a GPUCluster and no ClusterPolicy) every NVIDIADriver."""
    if active is None and dra:
        return nvidiadriver_owners(drivers, nodes)
    model = active.parsed.model if active is not None else None
    if active is None or model is None:
        return []
    if model.spec.driver.useNvidiaDriverCRD:
        return nvidiadriver_owners(drivers, nodes)
    owner = clusterpolicy_owner(active)
    return [owner] if owner is not None else []
