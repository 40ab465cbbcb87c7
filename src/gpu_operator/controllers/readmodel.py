"""The one read model the units share: what the watches hold, one typed view per kind, and the
queries over them (controllers/queries.py) answered in one place.

Filled by the reflectors (nodes, driver pods) and kopf's indices (our CRs, owned objects, GPU
feature discovery's NodeFeatures), and by start-up discovery (controllers/discovery.py,
`ClusterInfo`: facts that cost one request at start). Units read it; only the manager's watches
write it. The reconciling units (ClusterPolicy, NVIDIADriver, GPUCluster) take it once per pass as
one frozen `ReadSnapshot` (`ReadModel.snapshot()`), the same for all three. What a pass reads
besides it (the user's ConfigMaps) is controllers/passinputs.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.gpucluster import GROUP as GPUCLUSTER_GROUP
from gpu_operator.api.gpucluster import KIND as GPUCLUSTER_KIND
from gpu_operator.api.gpucluster import SINGLETON
from gpu_operator.api.gpucluster import VERSION as GPUCLUSTER_VERSION
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.controllers.customresources import (
    CLUSTER_POLICY,
    CUSTOM_RESOURCES,
    GPU_CLUSTER,
    NVIDIA_DRIVER,
    CustomResource,
)
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.queries import NodeDriver, active_policy, node_drivers, parse_drivers
from gpu_operator.controllers.views import (
    ClusterPolicyView,
    CRView,
    DriverPodView,
    GPUClusterView,
    NodeView,
    NVIDIADriverView,
    OwnedKey,
    OwnedView,
    first,
)
from gpu_operator.controllers.watchedkinds import GFD_FEATURES, OWNED_KINDS, WatchedKind

# kopf's index ids: each row's `index_id` (controllers/watchedkinds.py)
V = TypeVar("V", bound=CRView[Any])


@dataclass(frozen=True)
class ReadSnapshot:
    """What one reconcile pass sees: the read model taken once, at the pass's start, and handed
    whole to the ClusterPolicy, NVIDIADriver and GPUCluster reconciles (each reads what it needs).
    Frozen, and its sequences are tuples: a pass cannot change what another pass or unit sees.
    The one read a pass makes besides is its user ConfigMaps (controllers/passinputs.py)."""

    namespace: str
    info: ClusterInfo = ClusterInfo()  # start-up discovery's (controllers/discovery.py)
    # Our CRs' objects by row (controllers/customresources.py): read them with `objects(row)`.
    crs: Mapping[CustomResource[Any], tuple[CRView[Any], ...]] = field(default_factory=dict)
    nodes: tuple[NodeView, ...] = ()
    owned: Mapping[OwnedKey, OwnedView] = field(default_factory=dict)
    # Kinds whose objects `owned` holds (the watched ones); objects of any other kind the
    # renderer emits are remembered by the applier instead (controllers/apply.py).
    watched_kinds: frozenset[str] = frozenset(k.kind for k in OWNED_KINDS)

    def objects(self, resource: CustomResource[V]) -> tuple[V, ...]:
        """The objects of one of our CRs, as its row's view."""
        return cast("tuple[V, ...]", tuple(self.crs.get(resource, ())))

    @property
    def policies(self) -> tuple[ClusterPolicyView, ...]:
        return self.objects(CLUSTER_POLICY)

    @property
    def drivers(self) -> tuple[NVIDIADriverView, ...]:
        return self.objects(NVIDIA_DRIVER)

    @property
    def gpuclusters(self) -> tuple[GPUClusterView, ...]:  # a ClusterPolicy does not run beside one
        return self.objects(GPU_CLUSTER)


@dataclass
class ReadModel:
    namespace: str
    info: ClusterInfo = field(default_factory=ClusterInfo)
    # The Node reflector's views by name (the reflector's own dict, read in place).
    node_map: Mapping[str, NodeView] = field(default_factory=dict)
    # The driver pod reflector's views by pod name (its own dict, read in place).
    driver_pod_map: Mapping[str, DriverPodView] = field(default_factory=dict)
    # kopf's live indices by id, taken from its startup handler's kwargs (kopf's public way).
    indices: dict[str, Any] = field(default_factory=dict)
    owned_kinds: list[WatchedKind] = field(default_factory=lambda: list(OWNED_KINDS))
    # Our CRs the watches index and watch (controllers/watches.py): one row each.
    resources: tuple[CustomResource[Any], ...] = CUSTOM_RESOURCES

    def snapshot(self) -> ReadSnapshot:
        """One pass's frozen view of everything the reconciling units read (`ReadSnapshot`)."""
        return ReadSnapshot(
            self.namespace,
            self.info,
            {row: tuple(self.objects(row)) for row in self.resources},
            tuple(self.node_map.values()),
            self.owned(),
            self.watched_kinds,
        )

    # -- nodes -------------------------------------------------------------------------------------

    def nodes(self) -> list[NodeView]:
        return list(self.node_map.values())

    def node(self, name: str) -> NodeView | None:
        return self.node_map.get(name)

    # -- our CRs, one typed view per kind ------------------------------------------------------------

    def _views(self, index: str) -> list[Any]:
        return [v for store in self.indices[index].values() if (v := first(store)) is not None]

    def objects(self, resource: CustomResource[V]) -> list[V]:
        """The objects of one of our CRs (any row of `resources`), as its row's view."""
        return self._views(resource.index_id)

    def policies(self) -> list[ClusterPolicyView]:
        return self.objects(CLUSTER_POLICY)

    def drivers(self) -> list[NVIDIADriverView]:
        return self.objects(NVIDIA_DRIVER)

    def gpuclusters(self) -> list[GPUClusterView]:
        return self.objects(GPU_CLUSTER)

    def active_policy(self) -> ClusterPolicyView | None:
        """The singleton rule (controllers/queries.py): the oldest ClusterPolicy."""
        return active_policy(self.policies())

    def active_model(self) -> ClusterPolicy | None:
        """The active ClusterPolicy's parsed spec; None if there is none or it is invalid."""
        active = self.active_policy()
        return active.parsed.model if active is not None else None

    def active_gpucluster(self) -> GPUClusterView | None:
        """The GPUCluster that runs the DRA stack: the singleton, valid, not being deleted, and no
        ClusterPolicy beside it (which stops both)."""
        if self.policies():
            return None
        view = next((v for v in self.gpuclusters() if v.name == SINGLETON), None)
        if (
            view is None
            or view.parsed.model is None
            or view.body.get("metadata", {}).get("deletionTimestamp")
        ):
            return None
        return view

    def health_spec(self) -> HealthSpec | None:
        """GPU health's settings for the active stack: a valid ClusterPolicy's spec.health (its
        defaults where unset), the defaults under a GPUCluster (it has no spec.health); None
        without either (a ClusterPolicy the model refuses included): then health changes nothing."""
        policy = self.active_policy()
        if policy is not None:
            model = policy.parsed.model
            return (model.spec.health or HealthSpec()) if model is not None else None
        return HealthSpec() if self.active_gpucluster() is not None else None

    def gpucluster_owner(self) -> dict[str, Any] | None:
        """An ownerReference to the active GPUCluster (what the DRA stack's health objects hang on)."""
        view = self.active_gpucluster()
        if view is None:
            return None
        return {
            "apiVersion": f"{GPUCLUSTER_GROUP}/{GPUCLUSTER_VERSION}",
            "kind": GPUCLUSTER_KIND,
            "name": view.name,
            "uid": view.uid,
        }

    def valid_drivers(self) -> tuple[dict[str, NVIDIADriver], dict[str, str]]:
        """Valid NVIDIADrivers by name, and the invalid ones' errors naming the field."""
        return parse_drivers(self.drivers())

    def node_drivers(self) -> dict[str, NodeDriver]:
        """Per GPU node, its NVIDIADriver (owner, conflict, auto-upgrade, orphaned pod)."""
        valid, _ = self.valid_drivers()
        return node_drivers(valid.values(), self.nodes(), self.driver_pods())

    # -- pods and owned objects ------------------------------------------------------------------------

    def driver_pods(self) -> list[DriverPodView]:
        return list(self.driver_pod_map.values())

    def owned(self) -> dict[Any, OwnedView]:
        owned: dict[Any, OwnedView] = {}
        for kind in self.owned_kinds:
            for key, store in self.indices[kind.index_id].items():
                if (view := first(store)) is not None:
                    owned[key] = view
        return owned

    @property
    def watched_kinds(self) -> frozenset[str]:
        return frozenset(k.kind for k in self.owned_kinds)

    def gfd_labels(self, node: str) -> Mapping[str, str] | None:
        """The labels GFD's NodeFeature publishes for `node`; None where there is none (or the
        NodeFeature kind is not served, or the mirror is off)."""
        store = self.indices.get(GFD_FEATURES.index_id)
        if store is None or node not in store:
            return None
        labels: Mapping[str, str] | None = first(store[node])
        return labels
