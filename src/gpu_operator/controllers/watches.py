"""kopf's part of the watches: indices that fill the read model (our CRs, owned objects, GPU
feature discovery's NodeFeatures) and event handlers that turn each change into one `ObjectEvent`
for the manager to hand to the units. Handlers only record; units do the work. What is watched is
read from the table of watched kinds (controllers/watchedkinds.py): each row kopf serves is
registered by its event kind. Nodes and driver pods are not watched here: their reflectors
(controllers/reflector.py) do that."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from gpu_operator.controllers import kopflogin
from gpu_operator.controllers.customresources import CustomResource
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.echoes import StatusEchoes
from gpu_operator.controllers.loop import Event, EventKind, ObjectEvent
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.reflector import interned
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.views import CRView, OwnedView
from gpu_operator.controllers.watchedkinds import GFD_FEATURES, WatchedKind, WatchRow, event_of, watched_kinds
from gpu_operator.vocabulary import (
    GFD_NODE_FEATURE_PREFIX,
    MANAGED_BY,
    MANAGED_BY_VALUE,
    NFD_NODE_NAME_LABEL,
    NODE_FEATURE_GROUP,
    NODE_FEATURE_PLURAL,
)

# The label selectors the apiserver filters kopf's watches by, per event kind (none: every object)
SELECTORS: dict[EventKind | None, dict[str, str]] = {EventKind.OWNED: {MANAGED_BY: MANAGED_BY_VALUE}}

log = logging.getLogger("gpu_operator.operator")  # the process's logger (controllers/manager.py)


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
        # the table's rows kopf watches, as registered (tests/unit/chart/test_watched_kinds.py)
        self.watched: list[WatchRow] = []
        self.rows = watched_kinds(model.resources)
        kopf.on.login(registry=self.registry)(kopflogin.login)
        kopf.on.startup(registry=self.registry)(self._configure)

        @kopf.on.cleanup(registry=self.registry)
        async def cleanup(**_: Any) -> None:
            # kopf caught the signal itself; setting our stop flag too ends kopf's waiter on it
            # (otherwise a "hung" task that holds the shutdown for 5 s) and stops the lease keeper.
            stop()

        for row in self.rows:
            if not row.needs:
                self.watch(row)

    def watch(self, row: WatchRow) -> None:
        """Register one row of the table by its event kind (rows kopf does not watch: none)."""
        if isinstance(row, CustomResource):
            self._watch_cr(row)
        elif row.event is EventKind.OWNED:
            self.watch_owned(row)
        elif row.event is EventKind.GFD_FEATURES:
            self.watch_gfd_features(row)

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
        for row in self.watched:
            labels = SELECTORS.get(event_of(row))
            if labels:
                settings.watching.label_selectors[row.resource] = ",".join(
                    f"{k}={v}" for k, v in labels.items()
                )
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
        self.watched.append(resource)

    def watch_discovered(self, info: ClusterInfo, *, gfd_node_labels: bool) -> None:
        """The rows that need what start-up discovery found (their CRD served): ServiceMonitors
        (watched like the built-in kinds, so one is applied once and deleted when its state is
        disabled; a CRD installed later is seen at the next start), and GFD's NodeFeatures where
        the operator mirrors GFD's labels."""
        for row in self.rows:
            if not row.needs or (row is GFD_FEATURES and not gfd_node_labels):
                continue
            if getattr(info, row.needs):
                self.watch(row)
            elif row is GFD_FEATURES:
                log.warning(
                    "GPU feature discovery's labels will not reach the Nodes: the NodeFeature CRD "
                    "(%s.%s) is not installed. Install it (`gpu-operator crds apply`, the chart's hook "
                    "does) or NFD, then restart the operator",
                    NODE_FEATURE_PLURAL,
                    NODE_FEATURE_GROUP,
                )

    def watch_owned(self, kind: WatchedKind) -> None:
        """Index and watch the objects of one owned kind that carry our managed-by label (the
        same constant the renderer stamps, so the two cannot drift apart)."""
        managed = SELECTORS[EventKind.OWNED]

        async def indexed(body: kopf.Body, **_: Any) -> dict[Any, OwnedView]:
            view = OwnedView.of(body)
            return {view.key: view}

        async def changed(**_: Any) -> None:
            self._event(ObjectEvent(EventKind.OWNED))

        kopf.index(*kind.resource, id=kind.index_id, labels=managed, registry=self.registry)(indexed)
        kopf.on.event(
            *kind.resource, id=f"owned_event_{kind.plural}", labels=managed, registry=self.registry
        )(changed)
        self.watched.append(kind)
        if kind not in self.model.owned_kinds:
            self.model.owned_kinds.append(kind)

    def watch_gfd_features(self, row: WatchedKind = GFD_FEATURES) -> None:
        """GPU feature discovery's NodeFeature objects in our namespace, indexed by node: node
        labelling mirrors their labels onto the Nodes (controllers/units/labels/gfdlabels.py)."""

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

        kopf.index(*row.resource, id=row.index_id, registry=self.registry)(indexed)
        kopf.on.event(*row.resource, id=f"{row.index_id}_event", registry=self.registry)(changed)
        self.watched.append(row)


def gfd_node_of(name: str, labels: Mapping[str, str]) -> str | None:
    """The node a NodeFeature of GFD's speaks for: GFD names it `nvidia-features-for-<node>` and
    labels it with NFD's node-name label; any other NodeFeature is not GFD's and is ignored."""
    node = labels.get(NFD_NODE_NAME_LABEL) or ""
    return node if node and name == GFD_NODE_FEATURE_PREFIX + node else None
