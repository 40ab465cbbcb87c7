"""The operator process: a Node reflector (controllers/reflector.py) and kopf watches and indices
(ClusterPolicies, NVIDIADrivers, driver pods, owned kinds) feeding level-based loops
(ClusterPolicy reconcile, NVIDIADrivers, node labelling, driver upgrades); watch callbacks only
record interest, the loops do the work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from gpu_operator.controllers import kopflogin, metrics
from gpu_operator.controllers.cache import (
    DRIVER_COMPONENT,
    OWNED_KINDS,
    SERVICE_MONITOR,
    DriverPodView,
    NodeView,
    OwnedKind,
    OwnedView,
    PolicyView,
    first,
)
from gpu_operator.controllers.clusterpolicy import ClusterPolicyReconciler, Snapshot, active_policy
from gpu_operator.controllers.echoes import StatusEchoes
from gpu_operator.controllers.gfdlabels import gfd_node_of
from gpu_operator.controllers.gpucluster import ClusterSnapshot, GPUClusterReconciler
from gpu_operator.controllers.labelloop import LabelLoop, Sources
from gpu_operator.controllers.nvidiadriver import DriverSnapshot, NVIDIADriverReconciler
from gpu_operator.controllers.passloop import PassLoop
from gpu_operator.controllers.reflector import NodeReflector, interned
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.upgrade import UpgradeController
from gpu_operator.controllers.upgrade_owners import upgrade_owners
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import (
    MANAGED_BY,
    MANAGED_BY_VALUE,
    MANAGED_SELECTOR,
    NODE_FEATURE_GROUP,
    NODE_FEATURE_PLURAL,
    NODE_FEATURE_VERSION,
    UPGRADE_SKIP,
    UPGRADE_STATE,
)

log = logging.getLogger("gpu_operator.operator")

# The kopf indices the loops read; kopf hands them to every handler by id, the startup one too.
GFD_INDEX = "gfd_features"  # registered only where the NodeFeature kind is served and the mirror is on
INDEX_IDS = ("policies", "drivers", "gpuclusters", "driver_pods", *(f"owned_{k.plural}" for k in OWNED_KINDS))


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff base (a deep copy of the body's essence) for every event of every
    watched kind, whether or not a create/update handler would read it. We register none (only
    indices and on.event handlers), so the essence is empty: at 1,000 nodes the copies of
    DaemonSet and driver pod bodies were ~40% of the operator's CPU (bench/README.md)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})


class DiscoveryError(RuntimeError):
    """A start-up fact could not be read from the apiserver."""


@dataclass
class Loops:
    """Work signals between kopf handlers and the two loops."""

    indexed: asyncio.Event = field(default_factory=asyncio.Event)
    policy_kick: asyncio.Event = field(default_factory=asyncio.Event)
    label_kick: asyncio.Event = field(default_factory=asyncio.Event)
    driver_kick: asyncio.Event = field(default_factory=asyncio.Event)
    upgrade_kick: asyncio.Event = field(default_factory=asyncio.Event)
    cluster_kick: asyncio.Event = field(default_factory=asyncio.Event)
    nodes_synced: asyncio.Event = field(default_factory=asyncio.Event)
    dirty_nodes: set[str] = field(default_factory=set)

    async def ready(self) -> None:
        """Until kopf's indices are in (its first event) and the Node reflector's first list."""
        await self.indexed.wait()
        await self.nodes_synced.wait()

    def kick(self, nodes: set[str] | None = None) -> None:
        if nodes:
            self.dirty_nodes |= nodes
        self.policy_kick.set()
        self.label_kick.set()
        self.driver_kick.set()
        self.upgrade_kick.set()
        self.cluster_kick.set()

    def take_dirty(self) -> set[str]:
        dirty, self.dirty_nodes = self.dirty_nodes, set()
        return dirty


class Operator:
    def __init__(self, kube: Kube, namespace: str, settings: OperatorSettings | None = None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.settings = settings or OperatorSettings()
        self.loops = Loops()
        # kopf's live indices by id, taken from the startup handler's kwargs (kopf's public way)
        self.indices: dict[str, Any] = {}
        self.reconciler = ClusterPolicyReconciler(kube, self.settings)
        self.gpuclusters = GPUClusterReconciler(kube, self.settings)
        self.labels = LabelLoop(kube, self.settings, Sources(
            self.node_views, self.node_view, self.policy_views, self.gpucluster_views, self.driver_views,
            self.driver_pod_views, self.gfd_labels),
            self.loops.label_kick, lambda: self.loops.dirty_nodes, self.loops.take_dirty)
        self.k8s_version = ""  # set by discover() before any loop runs
        self.servicemonitor_crd = False
        self.node_feature_crd = False
        self.drivers = NVIDIADriverReconciler(kube, self.settings)
        self.upgrades = UpgradeController(kube, namespace, lambda: self.nodes.views.values(), self.settings,
                                          driver_pods=self.driver_pod_views)
        # What the upgrade state machine reads of a node's labels and our annotations, per node.
        self._upgrade_facts: dict[str, tuple[str | None, str | None, tuple[tuple[str, str], ...], bool, bool]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()
        self.owned_kinds: list[OwnedKind] = []
        self.nodes = NodeReflector(kube.http, kube.streams, self._node_changed, backoff=self.settings.watch_backoff,
                                   page_size=self.settings.watch_chunk_size,
                                   server_timeout=self.settings.watch_server_timeout,
                                   connect_timeout=self.settings.watch_connect_timeout)
        self.registry = self._registry()

    # -- kopf wiring ------------------------------------------------------------------------------

    def _registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()
        loops = self.loops

        kopf.on.login(registry=registry)(kopflogin.login)

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
            ids = [*INDEX_IDS, *(f"owned_{k.plural}" for k in self.owned_kinds if k not in OWNED_KINDS),
                   *((GFD_INDEX,) if self.node_feature_crd and self.settings.gfd_node_labels else ())]
            missing = [index for index in ids if index not in kwargs]
            if missing:  # kopf stopped passing indices to startup handlers: fail loudly, at once
                raise kopf.PermanentError(f"kopf did not pass the indices {missing} to the startup handler")
            self.indices = {index: kwargs[index] for index in ids}
            ours = self.settings
            settings.posting.enabled = False  # status and conditions speak; no kopf events
            settings.scanning.disabled = True  # no cluster-wide CRD/namespace discovery watches
            settings.watching.server_timeout = ours.watch_server_timeout
            settings.watching.client_timeout = ours.watch_client_timeout
            settings.watching.connect_timeout = ours.watch_connect_timeout
            settings.watching.chunk_size = ours.watch_chunk_size
            settings.queueing.idle_timeout = ours.watch_worker_idle
            settings.networking.error_backoffs = ours.api_error_backoffs
            # Owned kinds are filtered by the apiserver: a cluster's other ConfigMaps, Services
            # and RBAC objects never reach this process.
            for kind in self.owned_kinds:
                settings.watching.label_selectors[kind.resource] = MANAGED_SELECTOR
            settings.watching.label_selectors[("v1", "pods")] = f"{DRIVER_COMPONENT}=nvidia-driver"
            settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="gpu-operator")
            settings.persistence.diffbase_storage = NoDiffBase(prefix="gpu-operator")

        @kopf.on.cleanup(registry=registry)
        async def cleanup(**_: Any) -> None:
            # kopf caught the signal itself; setting our stop flag too ends kopf's waiter on it
            # (otherwise a "hung" task that holds the shutdown for 5 s) and stops the lease keeper.
            self.stop.set()

        @kopf.index("nvidia.com", "v1", "clusterpolicies", id="policies", registry=registry)
        async def policies(body: kopf.Body, name: str, **_: Any) -> dict[str, PolicyView]:
            return {name: PolicyView.of(body)}

        @kopf.index("nvidia.com", "v1alpha1", "nvidiadrivers", id="drivers", registry=registry)
        async def drivers(body: kopf.Body, name: str, **_: Any) -> dict[str, PolicyView]:
            return {name: PolicyView.of(body)}

        @kopf.index("nvidia.com", "v1alpha1", "gpuclusters", id="gpuclusters", registry=registry)
        async def gpuclusters(body: kopf.Body, name: str, **_: Any) -> dict[str, PolicyView]:
            return {name: PolicyView.of(body)}

        def cr_event(kind: str) -> Callable[..., Awaitable[None]]:
            """Any event of one of our CRs wakes every loop, except the echo of our own status
            write (controllers/echoes.py)."""
            echoes = StatusEchoes(lambda name: self.kube.statuses_written.get((kind, name)))

            async def event(body: kopf.Body, type: str | None, **_: Any) -> None:  # noqa: A002 (kopf's name)
                loops.indexed.set()
                if not echoes.is_echo(body, type):
                    loops.kick()
            return event

        for version, plural, cr_kind in (("v1", "clusterpolicies", "ClusterPolicy"),
                                         ("v1alpha1", "nvidiadrivers", "NVIDIADriver"),
                                         ("v1alpha1", "gpuclusters", "GPUCluster")):
            kopf.on.event("nvidia.com", version, plural, id=f"{plural}_event", registry=registry)(cr_event(cr_kind))

        # Driver pods (any owner, or none: the migration rule looks for orphaned ones).
        @kopf.index("pods", id="driver_pods", labels={DRIVER_COMPONENT: "nvidia-driver"}, registry=registry)
        async def driver_pods(body: kopf.Body, name: str, namespace: str | None,
                              **_: Any) -> dict[tuple[str | None, str], DriverPodView]:
            return {(namespace, name): DriverPodView.of(body)}

        @kopf.on.event("pods", labels={DRIVER_COMPONENT: "nvidia-driver"}, registry=registry)
        async def driver_pod_event(body: kopf.Body, **_: Any) -> None:
            loops.indexed.set()
            node = (body.get("spec") or {}).get("nodeName")
            if node:
                loops.dirty_nodes.add(node)
            loops.label_kick.set()
            loops.driver_kick.set()
            loops.upgrade_kick.set()

        for kind in OWNED_KINDS:
            self._watch_owned(registry, kind)
        return registry

    def _watch_owned(self, registry: kopf.OperatorRegistry, kind: OwnedKind) -> None:
        """Index and watch the objects of one owned kind that carry our managed-by label (the
        same constant the renderer stamps, so the two cannot drift apart)."""
        loops = self.loops
        managed = {MANAGED_BY: MANAGED_BY_VALUE}

        async def owned(body: kopf.Body, **_: Any) -> dict[Any, OwnedView]:
            view = OwnedView.of(body)
            return {view.key: view}

        async def owned_event(**_: Any) -> None:
            loops.indexed.set()
            loops.policy_kick.set()
            loops.driver_kick.set()
            loops.upgrade_kick.set()  # a new driver DaemonSet revision starts upgrades
            loops.cluster_kick.set()

        kopf.index(*kind.resource, id=f"owned_{kind.plural}", labels=managed, registry=registry)(owned)
        kopf.on.event(*kind.resource, id=f"owned_event_{kind.plural}", labels=managed,
                      registry=registry)(owned_event)
        if kind not in self.owned_kinds:
            self.owned_kinds.append(kind)

    def _watch_gfd_features(self, registry: kopf.OperatorRegistry) -> None:
        """GPU feature discovery's NodeFeature objects in our namespace, indexed by node: node
        labelling mirrors their labels onto the Nodes (controllers/gfdlabels.py); a change marks
        that node dirty for the label loop only."""
        loops = self.loops
        resource = (NODE_FEATURE_GROUP, NODE_FEATURE_VERSION, NODE_FEATURE_PLURAL)

        async def features(body: kopf.Body, name: str, **_: Any) -> dict[str, dict[str, str]]:
            node = gfd_node_of(name, body.get("metadata", {}).get("labels") or {})
            labels = (body.get("spec") or {}).get("labels") or {}
            return {node: interned({str(k): str(v) for k, v in labels.items()})} if node else {}

        async def event(body: kopf.Body, name: str, **_: Any) -> None:
            loops.indexed.set()
            node = gfd_node_of(name, body.get("metadata", {}).get("labels") or {})
            if node:
                loops.dirty_nodes.add(node)
                loops.label_kick.set()

        kopf.index(*resource, id=GFD_INDEX, registry=registry)(features)
        kopf.on.event(*resource, id=f"{GFD_INDEX}_event", registry=registry)(event)

    def _node_changed(self, name: str, view: NodeView | None) -> None:
        """The reflector saw a node appear, change what we read of it, or go. Events for one node
        coalesce in `dirty_nodes` until the loops' next pass."""
        before = self._upgrade_facts.pop(name, None)
        if view is None:
            self.labels.retries.forget(name)
            self.loops.policy_kick.set()
            self.loops.upgrade_kick.set()
            return
        facts = (view.labels.get(UPGRADE_STATE), view.labels.get(UPGRADE_SKIP), tuple(sorted(view.annotations.items())),
                 view.unschedulable, view.ready)
        self._upgrade_facts[name] = facts
        loops = self.loops
        loops.dirty_nodes.add(name)
        loops.policy_kick.set()
        loops.label_kick.set()
        loops.driver_kick.set()
        if facts != before:
            # A pass of the upgrade loop lists every node and driver pod: label-only changes
            # (thousands while a policy labels its nodes) do not start one; a new node, its
            # upgrade state label or its upgrade annotations do.
            loops.upgrade_kick.set()

    # -- snapshots of the caches ----------------------------------------------------------------

    def _index(self, name: str) -> Any:
        return self.indices[name]

    def node_views(self) -> list[NodeView]:
        return list(self.nodes.views.values())

    def node_view(self, name: str) -> NodeView | None:
        return self.nodes.views.get(name)

    def policy_views(self) -> list[PolicyView]:
        return [v for store in self._index("policies").values() if (v := first(store)) is not None]

    def driver_views(self) -> list[PolicyView]:
        return [v for store in self._index("drivers").values() if (v := first(store)) is not None]

    def gpucluster_views(self) -> list[PolicyView]:
        return [v for store in self._index("gpuclusters").values() if (v := first(store)) is not None]

    def gfd_labels(self, node: str) -> Mapping[str, str] | None:
        """The labels GFD's NodeFeature publishes for `node`; None where there is none (or the
        NodeFeature kind is not served, or the mirror is off)."""
        store = self.indices.get(GFD_INDEX)
        if store is None or node not in store:
            return None
        labels: Mapping[str, str] | None = first(store[node])
        return labels

    def driver_pod_views(self) -> list[DriverPodView]:
        return [v for store in self._index("driver_pods").values() if (v := first(store)) is not None]

    def owned_views(self) -> dict[Any, OwnedView]:
        owned: dict[Any, OwnedView] = {}
        for kind in self.owned_kinds:
            for key, store in self._index(f"owned_{kind.plural}").items():
                if (view := first(store)) is not None:
                    owned[key] = view
        return owned

    def driver_snapshot(self) -> DriverSnapshot:
        return DriverSnapshot(self.driver_views(), self.policy_views(), self.node_views(), self.owned_views(),
                              self.namespace, self.k8s_version,
                              watched_kinds=frozenset(k.kind for k in self.owned_kinds),
                              gpuclusters=[v.name for v in self.gpucluster_views()])

    def snapshot(self) -> Snapshot:
        return Snapshot(self.policy_views(), self.node_views(), self.owned_views(), self.namespace,
                        self.k8s_version, self.servicemonitor_crd,
                        watched_kinds=frozenset(k.kind for k in self.owned_kinds),
                        gpuclusters=[v.name for v in self.gpucluster_views()])

    def cluster_snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(self.gpucluster_views(), self.policy_views(), self.owned_views(), self.namespace,
                               watched_kinds=frozenset(k.kind for k in self.owned_kinds))

    # -- the loops --------------------------------------------------------------------------------

    def pass_loops(self) -> dict[str, PassLoop]:
        """The level-based controllers, each one PassLoop (controllers/passloop.py)."""
        def labels_first(one_pass: Callable[[], Awaitable[float | None]]) -> Callable[[], Awaitable[float | None]]:
            """While a new ClusterPolicy's labels are written (LabelLoop.labelling), the pass looks
            again after the coalescing window instead: the reconcile would start the operands' pods
            on every node as it is labelled, and every label echo would start an upgrade pass over
            every node that plans nothing (no driver pod runs before its DaemonSet)."""
            async def gated() -> float | None:
                if self.labels.labelling(active_policy(self.policy_views())):
                    return self.settings.coalesce
                return await one_pass()
            return gated

        async def policy_pass() -> float | None:
            report = await self.reconciler.reconcile(self.snapshot())
            metrics.record_reconcile(report)
            return report.requeue

        async def driver_pass() -> float | None:
            # NVIDIADrivers: one level-based reconcile of all of them (routing needs them all)
            return (await self.drivers.reconcile(self.driver_snapshot())).requeue

        async def cluster_pass() -> float | None:
            return (await self.gpuclusters.reconcile(self.cluster_snapshot())).requeue

        async def upgrade_pass() -> float | None:
            # Driver upgrades (controllers/upgrade.py): the state machine for the ClusterPolicy, or
            # for each NVIDIADriver on its own nodes (controllers/upgrade_owners.py).
            owners = upgrade_owners(active_policy(self.policy_views()), self.driver_views(), self.node_views(),
                                    dra=bool(self.gpucluster_views()))
            return await self.upgrades.reconcile(owners)

        settings = self.settings
        return {
            "clusterpolicy": PassLoop("ClusterPolicy reconcile", self.loops.policy_kick, labels_first(policy_pass), settings,
                                      on_error=lambda _err: metrics.record_error()),
            # no NVIDIADriver: nothing to snapshot (node bursts cost nothing here)
            "nvidiadriver": PassLoop("NVIDIADriver reconcile", self.loops.driver_kick, driver_pass, settings,
                                     idle=lambda: not self.driver_views()),
            "upgrade": PassLoop("driver upgrade pass", self.loops.upgrade_kick, labels_first(upgrade_pass), settings),
            # no GPUCluster: nothing to do
            "gpucluster": PassLoop("GPUCluster reconcile", self.loops.cluster_kick, cluster_pass, settings,
                                   idle=lambda: not self.gpucluster_views()),
        }

    async def node_reflector(self, stop: asyncio.Event) -> None:
        task = asyncio.create_task(self.nodes.run(stop))
        await self.nodes.synced.wait()
        log.info("Node reflector: %d nodes listed", len(self.nodes.views))
        self.loops.nodes_synced.set()
        await task

    async def _ready_when(self, kopf_ready: asyncio.Event, ready: asyncio.Event | None) -> None:
        """Ready once kopf has started and the Node reflector has its first list."""
        await kopf_ready.wait()
        await self.loops.nodes_synced.wait()
        if ready is not None:
            ready.set()

    async def _discover_once(self) -> None:
        version = await self.kube.server_version()
        if not version:
            raise DiscoveryError("GET /version answered without a gitVersion")
        crd = await self.kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                       "servicemonitors.monitoring.coreos.com")
        features = await self.kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                            f"{NODE_FEATURE_PLURAL}.{NODE_FEATURE_GROUP}")
        self.k8s_version, self.servicemonitor_crd = version, crd is not None
        self.node_feature_crd = features is not None

    async def discover(self) -> bool:
        """Cluster facts that need one request at start-up: the Kubernetes version (rendering
        depends on it) and whether the ServiceMonitor CRD exists. There is no made-up fallback:
        failures are logged with their reason and retried with backoff until they answer (the
        process stays not ready meanwhile). False when stop was set first."""
        failures = 0
        while not self.stop.is_set():
            try:
                await self._discover_once()
            except Exception as err:
                failures += 1
                delay = self.settings.discovery_backoff.delay(failures)
                log.warning("start-up discovery failed (GET /version and the ServiceMonitor CRD): %s; "
                            "not starting the loops, retrying in %.0f s", err, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=delay)
                continue
            log.info("Kubernetes %s; ServiceMonitor CRD %s; NodeFeature CRD %s", self.k8s_version,
                     "present" if self.servicemonitor_crd else "absent",
                     "present" if self.node_feature_crd else "absent")
            return True
        return False

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        self.stop = stop
        if not await self.discover():
            return
        if self.servicemonitor_crd:
            # Watched like the built-in kinds, so a ServiceMonitor is applied once and deleted
            # when its state is disabled. A CRD installed later is seen at the next start.
            self._watch_owned(self.registry, SERVICE_MONITOR)
        if self.settings.gfd_node_labels:
            if self.node_feature_crd:
                self._watch_gfd_features(self.registry)
            else:
                log.warning("GPU feature discovery's labels will not reach the Nodes: the NodeFeature CRD "
                            "(%s.%s) is not installed. Install it (`gpu-operator crds apply`, the chart's hook "
                            "does) or NFD, then restart the operator", NODE_FEATURE_PLURAL, NODE_FEATURE_GROUP)
        kopf_ready = asyncio.Event()
        self.tasks = [asyncio.create_task(self.node_reflector(stop), name="node-reflector"),
                      asyncio.create_task(self._ready_when(kopf_ready, ready), name="readiness"),
                      asyncio.create_task(self.labels.run(self.loops.ready), name="node-labelling"),
                      asyncio.create_task(metrics.sample_loop_lag(), name="event-loop-lag"),
                      *(asyncio.create_task(loop.run(self.loops.ready), name=name)
                        for name, loop in self.pass_loops().items())]
        try:
            # Namespaced kinds are watched in the operator's namespace only (least privilege:
            # the chart grants no cluster-wide reads of ConfigMaps or Secrets); cluster-scoped
            # kinds (nodes, ClusterPolicies, ClusterRoles, RuntimeClasses) are watched whole.
            await kopf.operator(registry=self.registry, clusterwide=False,
                                namespaces=[self.namespace], standalone=True, stop_flag=stop,
                                ready_flag=kopf_ready)
        finally:
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

