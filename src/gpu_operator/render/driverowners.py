"""Which NVIDIADriver owns which GPU node (upstream's AssignOwners rule, failing closed on conflicts).

A GPU node belongs to the one non-default NVIDIADriver whose nodeSelector picks it; failing that, to
the single `default: true` NVIDIADriver. Two claimants (two selectors, or two defaults) are a
conflict: the node is given to neither, keeps whatever owner label it already has, and both
NVIDIADrivers report it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.render.nvidiadriver import selects


@dataclass
class Routing:
    owners: dict[str, str] = field(default_factory=dict)  # node -> NVIDIADriver name
    conflicts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> claimants

    def owned_by(self, name: str) -> list[str]:
        return sorted(node for node, owner in self.owners.items() if owner == name)

    def conflicts_of(self, name: str) -> dict[str, tuple[str, ...]]:
        return {node: names for node, names in sorted(self.conflicts.items()) if name in names}


def claimants(drivers: Iterable[NVIDIADriver], labels: Mapping[str, str]) -> list[str]:
    """The NVIDIADrivers that claim a node: the matching non-default ones, else the defaults."""
    drivers = list(drivers)
    picked = sorted(d.metadata.name for d in drivers if not d.spec.default and selects(d.spec, labels))
    return picked or sorted(d.metadata.name for d in drivers if d.spec.default)


def route(drivers: Iterable[NVIDIADriver], gpu_nodes: Mapping[str, Mapping[str, str]]) -> Routing:
    """Owners of GPU nodes (name -> labels); conflicting nodes go to nobody and are listed."""
    drivers = list(drivers)
    routing = Routing()
    for node, labels in sorted(gpu_nodes.items()):
        names = claimants(drivers, labels)
        if len(names) == 1:
            routing.owners[node] = names[0]
        elif names:
            routing.conflicts[node] = tuple(names)
    return routing


def conflict_message(node: str, names: tuple[str, ...]) -> str:
    return (
        f"node {node} is selected by NVIDIADrivers {', '.join(names)}: make their spec.nodeSelector "
        "disjoint (or keep a single default); the node keeps its current driver until then"
    )
