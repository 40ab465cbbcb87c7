"""kopf's part of the watches: indices that fill the read model (our CRs, driver pods, owned
objects, GPU feature discovery's NodeFeatures) and event handlers that turn each change into one
`ObjectEvent` for the manager to hand to the units. Handlers only record; units do the work.
Nodes are not watched here: the Node reflector (controllers/reflector.py) does that."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import kopf

from gpu_operator.controllers import kopflogin
from gpu_operator.controllers.customresources import CustomResource
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.echoes import StatusEchoes
from gpu_operator.controllers.loop import Event, EventKind, ObjectEvent
from gpu_operator.controllers.readmodel import DRIVER_PODS, GFD_FEATURES, ReadModel, owned_index
from gpu_operator.controllers.reflector import interned
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.views import (
    OWNED_KINDS,
    SERVICE_MONITOR,
    CRView,
    DriverPodView,
    OwnedKind,
    OwnedView,
)
from gpu_operator.vocabulary import (
    COMPONENT,
    DRIVER_COMPONENT_VALUE,
    GFD_NODE_FEATURE_PREFIX,
    MANAGED_BY,
    MANAGED_BY_VALUE,
    MANAGED_SELECTOR,
    NFD_NODE_NAME_LABEL,
    NODE_FEATURE_GROUP,
    NODE_FEATURE_PLURAL,
    NODE_FEATURE_VERSION,
)

DRIVER_POD_LABELS = {COMPONENT: DRIVER_COMPONENT_VALUE}

log = logging.getLogger("gpu_operator.operator")  # the process's logger (controllers/manager.py)


class Watched(NamedTuple):
    """One kind kopf watches: its resource (kopf's (group, version, plural), or (version, plural)
    for the core group) and the id of the index that fills the read model. Every registration
    adds its row, and the indices the startup handler takes are read from these rows, so a new
    watch cannot be forgotten there (tests/unit/chart/test_watched_kinds.py also holds every
    row to the chart's list and watch grants)."""

    resource: tuple[str, ...]
    index_id: str


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff base (a deep copy of the body's essence) for every event of every
    watched kind, whether or not a create/update handler would read it. We register none (only
    indices and on.event handlers), so the essence is empty: at 1,000 nodes the copies of
    DaemonSet and driver pod bodies were ~40% of the operator's CPU (bench/README.md)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})


class Watches:
    """The kopf registry. `dispatch` receives every event; `indexed` is set at kopf's first event
    (its indices are in by then); `stop` is set when kopf caught a signal itself."""

    def __init__(
        self,
        model: ReadModel,
        settings: OperatorSettings,
        dispatch: Callable[[Event], None],
        status_written: Callable[[tuple[str, str]], Any],
        stop: Callable[[], None],
    ) -> None:
        self.model = model
        self.settings = settings
        self.dispatch = dispatch
        self.status_written = status_written
        self.indexed = asyncio.Event()
        self.registry = kopf.OperatorRegistry()
        self.watched: list[Watched] = []
        self._owned: list[OwnedKind] = []
        kopf.on.login(registry=self.registry)(kopflogin.login)
        kopf.on.startup(registry=self.registry)(self._configure)

        @kopf.on.cleanup(registry=self.registry)
        async def cleanup(**_: Any) -> None:
            # kopf caught the signal itself; setting our stop flag too ends kopf's waiter on it
            # (otherwise a "hung" task that holds the shutdown for 5 s) and stops the lease keeper.
            stop()

        for resource in model.resources:  # our CRs' rows (controllers/customresources.py)
            self._watch_cr(resource)
        self._watch_driver_pods()
        for owned in OWNED_KINDS:
            self.watch_owned(owned)

    def _configure(self, settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        ids = [w.index_id for w in self.watched]
        missing = [index for index in ids if index not in kwargs]
        if missing:  # kopf stopped passing indices to startup handlers: fail loudly, at once
            raise kopf.PermanentError(f"kopf did not pass the indices {missing} to the startup handler")
        self.model.indices.update({index: kwargs[index] for index in ids})
        ours = self.settings
        settings.posting.enabled = False  # status and conditions speak; no kopf events
        settings.scanning.disabled = True  # no cluster-wide CRD/namespace discovery watches
        settings.watching.server_timeout = ours.watch_server_timeout
        settings.watching.client_timeout = ours.watch_client_timeout
        settings.watching.connect_timeout = ours.watch_connect_timeout
        settings.watching.chunk_size = ours.watch_chunk_size
        settings.queueing.idle_timeout = ours.watch_worker_idle
        settings.networking.error_backoffs = ours.api_error_backoffs
        # Owned kinds are filtered by the apiserver: a cluster's other ConfigMaps, Services and
        # RBAC objects never reach this process.
        for kind in self._owned:
            settings.watching.label_selectors[kind.resource] = MANAGED_SELECTOR
        settings.watching.label_selectors[("v1", "pods")] = f"{COMPONENT}={DRIVER_COMPONENT_VALUE}"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="gpu-operator")
        settings.persistence.diffbase_storage = NoDiffBase(prefix="gpu-operator")

    def _event(self, event: ObjectEvent) -> None:
        self.indexed.set()
        self.dispatch(event)

    def _watch_cr(self, resource: CustomResource[Any]) -> None:
        """Any event of one of our CRs is an event, except the echo of our own status write
        (controllers/echoes.py)."""
        echoes = StatusEchoes(lambda name: self.status_written((resource.kind, name)))
        event = ObjectEvent(EventKind.CUSTOM_RESOURCE, resource=resource)

        async def indexed(body: kopf.Body, name: str, **_: Any) -> dict[str, CRView[Any]]:
            return {name: resource.view.of(body)}

        async def changed(body: kopf.Body, type: str | None, **_: Any) -> None:  # noqa: A002 (kopf's name)
            self.indexed.set()
            if not echoes.is_echo(body, type):
                self.dispatch(event)

        kopf.index(*resource.resource, id=resource.index_id, registry=self.registry)(indexed)
        kopf.on.event(*resource.resource, id=f"{resource.plural}_event", registry=self.registry)(changed)
        self.watched.append(Watched(resource.resource, resource.index_id))

    def _watch_driver_pods(self) -> None:
        """Driver pods (any owner, or none: the migration rule looks for orphaned ones)."""

        async def indexed(
            body: kopf.Body, name: str, namespace: str | None, **_: Any
        ) -> dict[tuple[str | None, str], DriverPodView]:
            return {(namespace, name): DriverPodView.of(body)}

        async def changed(body: kopf.Body, **_: Any) -> None:
            self._event(ObjectEvent(EventKind.DRIVER_POD, (body.get("spec") or {}).get("nodeName") or None))

        kopf.index("pods", id=DRIVER_PODS, labels=DRIVER_POD_LABELS, registry=self.registry)(indexed)
        kopf.on.event("pods", labels=DRIVER_POD_LABELS, registry=self.registry)(changed)
        self.watched.append(Watched(("v1", "pods"), DRIVER_PODS))

    def watch_discovered(self, info: ClusterInfo, *, gfd_node_labels: bool) -> None:
        """The watches that depend on what start-up discovery found: ServiceMonitors where their
        CRD is served, GFD's NodeFeatures where theirs is and the operator mirrors GFD's labels."""
        if info.servicemonitor_crd:
            # Watched like the built-in kinds, so a ServiceMonitor is applied once and deleted
            # when its state is disabled. A CRD installed later is seen at the next start.
            self.watch_owned(SERVICE_MONITOR)
        if not gfd_node_labels:
            return
        if info.node_feature_crd:
            self.watch_gfd_features()
        else:
            log.warning(
                "GPU feature discovery's labels will not reach the Nodes: the NodeFeature CRD "
                "(%s.%s) is not installed. Install it (`gpu-operator crds apply`, the chart's hook "
                "does) or NFD, then restart the operator",
                NODE_FEATURE_PLURAL,
                NODE_FEATURE_GROUP,
            )

    def watch_owned(self, kind: OwnedKind) -> None:
        """Index and watch the objects of one owned kind that carry our managed-by label (the
        same constant the renderer stamps, so the two cannot drift apart)."""
        managed = {MANAGED_BY: MANAGED_BY_VALUE}

        async def indexed(body: kopf.Body, **_: Any) -> dict[Any, OwnedView]:
            view = OwnedView.of(body)
            return {view.key: view}

        async def changed(**_: Any) -> None:
            self._event(ObjectEvent(EventKind.OWNED))

        index = owned_index(kind)
        kopf.index(*kind.resource, id=index, labels=managed, registry=self.registry)(indexed)
        kopf.on.event(
            *kind.resource, id=f"owned_event_{kind.plural}", labels=managed, registry=self.registry
        )(changed)
        self.watched.append(Watched(kind.resource, index))
        self._owned.append(kind)
        if kind not in self.model.owned_kinds:
            self.model.owned_kinds.append(kind)

    def watch_gfd_features(self) -> None:
        """GPU feature discovery's NodeFeature objects in our namespace, indexed by node: node
        labelling mirrors their labels onto the Nodes (controllers/units/labels/gfdlabels.py)."""
        resource = (NODE_FEATURE_GROUP, NODE_FEATURE_VERSION, NODE_FEATURE_PLURAL)

        async def indexed(body: kopf.Body, name: str, **_: Any) -> dict[str, dict[str, str]]:
            node = gfd_node_of(name, body.get("metadata", {}).get("labels") or {})
            labels = (body.get("spec") or {}).get("labels") or {}
            return {node: interned({str(k): str(v) for k, v in labels.items()})} if node else {}

        async def changed(body: kopf.Body, name: str, **_: Any) -> None:
            self._event(
                ObjectEvent(
                    EventKind.GFD_FEATURES, gfd_node_of(name, body.get("metadata", {}).get("labels") or {})
                )
            )

        kopf.index(*resource, id=GFD_FEATURES, registry=self.registry)(indexed)
        kopf.on.event(*resource, id=f"{GFD_FEATURES}_event", registry=self.registry)(changed)
        self.watched.append(Watched(resource, GFD_FEATURES))


def gfd_node_of(name: str, labels: Mapping[str, str]) -> str | None:
    """The node a NodeFeature of GFD's speaks for: GFD names it `nvidia-features-for-<node>` and
    labels it with NFD's node-name label; any other NodeFeature is not GFD's and is ignored."""
    node = labels.get(NFD_NODE_NAME_LABEL) or ""
    return node if node and name == GFD_NODE_FEATURE_PREFIX + node else None
