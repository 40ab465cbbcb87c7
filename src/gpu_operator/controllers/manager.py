"""The operator process: registers the watches and the units, and hands every event to every
unit (each decides what it wants: controllers/loop.py). It knows nothing of what a unit does.

Nodes and driver pods come from their reflectors (controllers/reflector.py), everything else
from kopf's watches (controllers/watches.py); both fill the one read model (controllers/readmodel.py) the
units read. The units are the folders under controllers/units/ (`units()` builds one per folder);
this module names none of them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import kopf

from gpu_operator.controllers import metrics
from gpu_operator.controllers.customresources import CLUSTER_POLICY
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.environment import Environment
from gpu_operator.controllers.loop import Event, EventKind, NodeEvent, ObjectEvent, UnitLoop
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.reflector import NodeReflector, WatchSizes, driver_pod_reflector
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.unitparts import UnitParts
from gpu_operator.controllers.units import units
from gpu_operator.controllers.views import DriverPodView, NodeView
from gpu_operator.controllers.watches import Watches
from gpu_operator.kube.client import Kube
from gpu_operator.kube.configwatch import ConfigMapWatch

log = logging.getLogger("gpu_operator.operator")


class Manager:
    def __init__(
        self, kube: Kube, environment: Environment, settings: OperatorSettings | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings = settings or OperatorSettings()
        self.stop = asyncio.Event()
        watch = WatchSizes(
            page_size=settings.watch_chunk_size,
            server_timeout=settings.watch_server_timeout,
            connect_timeout=settings.watch_connect_timeout,
        )
        self.nodes = NodeReflector(
            kube.http, kube.streams, self._node_changed, backoff=settings.watch_backoff, **watch
        )
        self.driver_pods = driver_pod_reflector(
            kube.http,
            kube.streams,
            self._driver_pod_changed,
            namespace=environment.namespace,
            backoff=settings.watch_backoff,
            **watch,
        )
        self.model = model = ReadModel(
            environment.namespace, node_map=self.nodes.views, driver_pod_map=self.driver_pods.views
        )
        self.watches = Watches(model, settings, self.dispatch, kube.statuses_written.get, self.stop.set)
        # the user's devicePlugin.config ConfigMap, by name (kopf's ConfigMap watch sees only ours)
        self.plugin_config = ConfigMapWatch(
            kube,
            environment.namespace,
            lambda _name: self.dispatch(ObjectEvent(EventKind.PLUGIN_CONFIG)),
            settings.watch_backoff.delay,
        )
        # one unit per folder under controllers/units/, each built by its package's `build`
        self.units = units(UnitParts(kube, settings, model, environment.images, self._labels_first))
        self.loops = [
            UnitLoop(unit, settings.coalesce, unit.backoff or settings.reconcile_backoff)  # type: ignore[arg-type]
            for unit in self.units
        ]
        self.nodes_synced = asyncio.Event()

    def _labels_first(self) -> bool:
        """While a new ClusterPolicy's labels are written (a unit `holds_back`: node labelling's
        LabelUnit.labelling), the reconcile and the upgrade pass look again after the coalescing
        window instead: the reconcile would start the operands' pods on every node as it is
        labelled, and every label echo would start an upgrade pass over every node that plans
        nothing (no driver pod runs before its DaemonSet)."""
        return any(unit.holds_back() for unit in self.units)

    def dispatch(self, event: Event) -> None:
        if isinstance(event, ObjectEvent) and event.of(CLUSTER_POLICY):
            policy = self.model.active_model()
            config = policy.spec.devicePlugin.config if policy is not None else None
            self.plugin_config.follow(config.name if config is not None and config.name else None)
        for loop in self.loops:
            loop.offer(event)

    def _node_changed(self, name: str, view: NodeView | None) -> None:
        """The reflector saw a node appear, change what we read of it, or go."""
        self.dispatch(NodeEvent(name, view))

    def _driver_pod_changed(self, _name: str, view: DriverPodView | None, old: DriverPodView | None) -> None:
        """The driver pod reflector saw a driver pod appear, change what we read of it, or go:
        an event for the node it runs (or ran) on."""
        pod = view if view is not None else old
        self.dispatch(ObjectEvent(EventKind.DRIVER_POD, (pod.node if pod is not None else "") or None))

    async def _listed(self) -> None:
        """Until both reflectors have their first lists in."""
        await self.nodes_synced.wait()
        await self.driver_pods.synced.wait()

    async def ready(self) -> None:
        """Until kopf's indices are in (its first event) and the reflectors' first lists."""
        await self.watches.indexed.wait()
        await self._listed()

    async def _reflect_nodes(self, stop: asyncio.Event) -> None:
        task = asyncio.create_task(self.nodes.run(stop))
        await self.nodes.synced.wait()
        log.info("Node reflector: %d nodes listed", len(self.nodes.views))
        self.nodes_synced.set()
        await task

    async def _ready_when(
        self,
        kopf_ready: asyncio.Event,
        ready: asyncio.Event | None,
        on_kopf_started: Callable[[], None] | None,
    ) -> None:
        """Ready once kopf has started and the reflectors have their first lists."""
        await kopf_ready.wait()
        if on_kopf_started is not None:
            on_kopf_started()
        await self._listed()
        if ready is not None:
            ready.set()

    async def run(
        self,
        stop: asyncio.Event,
        ready: asyncio.Event | None = None,
        on_kopf_started: Callable[[], None] | None = None,
    ) -> None:
        self.stop = stop
        info = await ClusterInfo.discover(self.kube, stop, self.settings.discovery_backoff)
        if info is None:
            return
        self.model.info = info
        self.watches.watch_discovered(info, gfd_node_labels=self.settings.gfd_node_labels)
        kopf_ready = asyncio.Event()
        tasks = [
            asyncio.create_task(self._reflect_nodes(stop), name="node-reflector"),
            asyncio.create_task(self.driver_pods.run(stop), name="driver-pod-reflector"),
            asyncio.create_task(self._ready_when(kopf_ready, ready, on_kopf_started), name="readiness"),
            asyncio.create_task(metrics.sample_loop_lag(), name="event-loop-lag"),
            *(asyncio.create_task(loop.run(self.ready), name=loop.name) for loop in self.loops),
        ]
        tasks.append(asyncio.create_task(cancel_at_stop(stop, list(tasks)), name="cancel-at-stop"))
        try:
            # Namespaced kinds are watched in the operator's namespace only (least privilege: the
            # chart grants no cluster-wide reads of ConfigMaps or Secrets); cluster-scoped kinds
            # (nodes, ClusterPolicies, ClusterRoles, RuntimeClasses) are watched whole.
            await kopf.operator(
                registry=self.watches.registry,
                clusterwide=False,
                namespaces=[self.model.namespace],
                standalone=True,
                stop_flag=stop,
                ready_flag=kopf_ready,
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.plugin_config.stop()


async def cancel_at_stop(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    """Cancel `tasks` as soon as `stop` is set: a unit waits for its next kick or requeue (up to
    minutes), and kopf, stopping on the same flag, would wait 5 s for what they wait on before
    cancelling it. A pass cut short is done again by the next leader (every unit is level-triggered)."""
    await stop.wait()
    for task in tasks:
        task.cancel()
