"""The machinery of the simulator's stand-ins (`sim/standins/roster.py`): what they read of a component's
pod and of a Node, a list + watch that reports only changes (`Reflector`), a coalescing work queue
with retries (`WorkQueue`), and `NodeStandIns`, which drives the node components' stand-ins
(`Player`s: `sim/standins/gfd.py`, `sim/standins/kubeletdp.py`, `sim/standins/draplugin.py`, `sim/standins/migmanager.py`,
`sim/standins/health.py`) from one watch of their pods."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.operators import in_
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import OnErrorAction, OnErrorResult

from gpu_operator import shapes
from gpu_operator.shapes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE, SHAPE_LABEL, Shape, ShapeError
from gpu_operator.vocabulary import VM_PASSTHROUGH, WORKLOAD_CONFIG

log = logging.getLogger("gpu_operator.sim.standins")  # one logger for all stand-ins


def _seconds(value: Any) -> int:
    """A Kubernetes time (datetime or RFC 3339 text) as Unix seconds; 0 if absent."""
    if value is None:
        return 0
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


def _devices(spec: Any) -> tuple[tuple[str, str, int], ...]:
    """(container, resource, count) of the extended resources the containers' limits ask for (the
    kubelet allocates a device plugin's resource by its limit, which the request must equal)."""
    found = []
    for container in (spec.containers if spec else None) or []:
        limits = (container.resources.limits if container.resources else None) or {}
        for name, value in sorted(limits.items()):
            if "/" in name and str(value).isdigit():
                found.append((str(container.name), str(name), int(str(value))))
    return tuple(found)


@dataclass(frozen=True)
class PodView:
    """What the stand-ins read of a component's pod."""

    namespace: str
    name: str
    uid: str
    app: str
    node: str
    running: bool  # phase Running and not terminating: the component's process runs
    started: int  # status.startTime (else creation), Unix seconds
    daemonset: dict[str, str] | None = None  # its DaemonSet owner reference
    env: dict[str, str] = field(
        default_factory=dict
    )  # literal env values ("" set empty), first container first
    containers: tuple[str, ...] = ()  # the names of its (regular) containers
    # its first container's hostPath mounts: (mountPath, the volume's host path)
    host_mounts: tuple[tuple[str, str], ...] = ()
    # every container's ConfigMap volume mounts: (container, mountPath, the ConfigMap's name)
    configmaps: tuple[tuple[str, str, str], ...] = ()
    argv: tuple[str, ...] = ()  # its first container's command + args
    # extended resources its containers ask for (a name with a "/"): (container, resource, count)
    devices: tuple[tuple[str, str, int], ...] = ()
    terminated: bool = False  # phase Succeeded or Failed, or being deleted: it holds no device
    service_account: str = "default"  # spec.serviceAccountName: whose token its process holds
    # phase Pending with condition Initialized False, not terminating: the kubelet holds it in its
    # init containers (a stand-in of an init container says so: sim/standins/vgpustandin.py)
    initializing: bool = False

    @classmethod
    def of(cls, pod: Any, label: str = "app") -> PodView:
        """The pod's view; `app` is the value of its `label` (the component's pod label)."""
        meta, spec, status = pod.metadata, pod.spec, pod.status
        owner = next((r for r in meta.ownerReferences or [] if r.kind == "DaemonSet"), None)
        env: dict[str, str] = {}
        for container in (spec.containers if spec else None) or []:
            for var in container.env or []:
                if var.valueFrom is None:  # a value "" comes back without one: the variable is set, empty
                    env.setdefault(var.name, var.value or "")
        hosts = {v.name: v.hostPath.path for v in (spec.volumes if spec else None) or [] if v.hostPath}
        maps = {v.name: v.configMap.name for v in (spec.volumes if spec else None) or [] if v.configMap}
        first = ((spec.containers if spec else None) or [None])[0]
        mounts = tuple(
            (m.mountPath, hosts[m.name])
            for m in (first.volumeMounts if first else None) or []
            if m.name in hosts
        )
        return cls(
            namespace=str(meta.namespace),
            name=str(meta.name),
            uid=str(meta.uid or ""),
            app=str((meta.labels or {}).get(label, "")),
            node=str((spec.nodeName if spec else None) or ""),
            running=status is not None and status.phase == "Running" and meta.deletionTimestamp is None,
            started=_seconds((status.startTime if status else None) or meta.creationTimestamp),
            daemonset=None
            if owner is None
            else {"apiVersion": owner.apiVersion, "kind": owner.kind, "name": owner.name, "uid": owner.uid},
            env=env,
            containers=tuple(str(c.name) for c in (spec.containers if spec else None) or []),
            host_mounts=mounts,
            argv=tuple(
                str(a)
                for a in [*((first.command or []) if first else []), *((first.args or []) if first else [])]
            ),
            devices=_devices(spec),
            terminated=meta.deletionTimestamp is not None
            or (status is not None and status.phase in ("Succeeded", "Failed")),
            service_account=str((spec.serviceAccountName if spec else None) or "default"),
            initializing=status is not None
            and status.phase == "Pending"
            and meta.deletionTimestamp is None
            and any(c.type == "Initialized" and c.status == "False" for c in status.conditions or []),
            configmaps=tuple(
                (str(c.name), m.mountPath, str(maps[m.name]))
                for c in (spec.containers if spec else None) or []
                for m in c.volumeMounts or []
                if m.name in maps
            ),
        )


@dataclass(frozen=True)
class StandinNodeView:
    """What the stand-ins read of a Node (fetched once, when a component's pod first lands there)."""

    name: str
    uid: str
    labels: dict[str, str]
    capacity: dict[str, str]
    shape: Shape | None  # None: not a simulator kwok node (no shape label, or not kwok's)

    @classmethod
    def of(cls, node: Any) -> StandinNodeView:
        meta, status = node.metadata, node.status
        labels = dict(meta.labels or {})
        shape = None
        if (meta.annotations or {}).get(KWOK_ANNOTATION) == KWOK_ANNOTATION_VALUE and SHAPE_LABEL in labels:
            with contextlib.suppress(ShapeError):
                shape = shapes.load(labels[SHAPE_LABEL])
        capacity = {k: str(v) for k, v in ((status.capacity if status else None) or {}).items()}
        return cls(
            name=str(meta.name), uid=str(meta.uid or ""), labels=labels, capacity=capacity, shape=shape
        )

    @property
    def nvidia_gpus(self) -> int:
        """The GPUs NVML sees on this node: its shape's, none where they go to VMs."""
        if self.shape is None or self.labels.get(WORKLOAD_CONFIG) == VM_PASSTHROUGH:
            return 0
        return self.shape.nvidia_gpus


class Player(Protocol):
    """One component's stand-in: `sync` is called with the component's pods on a node (any
    phase) whenever they change; it returns seconds after which to be called again, or None.
    A player with an `attach(wake)` method is given `wake(node)`, which has `sync` called for that
    node soon (a change it learnt of elsewhere, e.g. the node's host tree). A player whose
    component's pods are not labelled app=<app> names its label key in `pod_label` (KubeVirt's:
    kubevirt.io=virt-handler)."""

    app: str  # the component's pod label app=<app> (or <pod_label>=<app>)
    field_manager: str

    async def start(self, client: AsyncClient) -> None: ...

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None: ...


async def run_together(tasks: list[asyncio.Task[Any]]) -> None:
    """Until one of the tasks fails (or we are cancelled); then the others are cancelled too."""
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def describe(err: Exception) -> str:
    """An API failure in one line: the apiserver's message, or the HTTP status and path."""
    if isinstance(err, ApiError):
        return str(err.status.message)
    response = getattr(err, "response", None)
    if response is not None:
        return f"{response.status_code} {response.reason_phrase} for {response.request.url.path}"
    return f"{type(err).__name__}: {err}"


def _status(err: Exception) -> int | None:
    """The HTTP status of an API failure (None when it is not one)."""
    if isinstance(err, ApiError):
        return int(err.status.code or 0)
    response = getattr(err, "response", None)
    return None if response is None else int(response.status_code)


def _watch_errors(err: Exception, count: int) -> OnErrorResult:
    """Resume a broken watch from its last version; a version too old (410) ends it: relist."""
    if isinstance(err, ApiError) and err.status.code == 410:
        return OnErrorResult(OnErrorAction.STOP)
    return OnErrorResult(OnErrorAction.RETRY, sleep=min(0.2 * count, 5.0))


class Reflector:
    """List + watch of one resource (label-selected, every namespace); `on_change(old, new)` for
    each object added, changed or removed (None on the missing side). A watch too old or a failed
    one relists and reports only the difference; `optional`: a kind not served (404, its CRD not
    installed) is logged at info, not as a warning."""

    def __init__(
        self,
        client: AsyncClient,
        resource: Any,
        labels: dict[str, Any],
        view: Callable[[Any], Any],
        on_change: Callable[[Any, Any], None],
        what: str,
        optional: bool = False,
    ) -> None:
        self.client, self.resource, self.labels, self.optional = client, resource, labels, optional
        self.view, self.on_change, self.what = view, on_change, what
        self.objects: dict[tuple[str, str], Any] = {}
        self.synced = asyncio.Event()
        self.last_error = ""

    def _see(self, key: tuple[str, str], new: Any) -> None:
        old = self.objects.get(key)
        if new is None:
            self.objects.pop(key, None)
        else:
            self.objects[key] = new
        if old != new:
            self.on_change(old, new)

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                listed = self.client.list(self.resource, namespace="*", labels=self.labels)
                seen: dict[tuple[str, str], Any] = {}
                async for obj in listed:
                    seen[(str(obj.metadata.namespace), str(obj.metadata.name))] = self.view(obj)
                for key in set(self.objects) - set(seen):
                    self._see(key, None)
                for key, new in seen.items():
                    self._see(key, new)
                self.synced.set()
                failures, self.last_error = 0, ""
                async for kind, obj in self.client.watch(
                    self.resource,
                    namespace="*",
                    labels=self.labels,
                    resource_version=listed.resourceVersion,
                    on_error=_watch_errors,
                ):
                    key = (str(obj.metadata.namespace), str(obj.metadata.name))
                    self._see(key, None if kind == "DELETED" else self.view(obj))
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - an outage or a missing CRD: list again later
                failures += 1
                message = describe(err)
                if message != self.last_error:  # once per distinct failure
                    # a kind not served (its CRD not installed) is normal where `optional`
                    level = logging.INFO if self.optional and _status(err) == 404 else logging.WARNING
                    log.log(level, "%s: %s; listing again", self.what, message)
                self.last_error = message
                await asyncio.sleep(min(0.5 * failures, 5.0))


class WorkQueue:
    """Keys to handle, each at most once at a time and coalesced while waiting; `concurrency`
    workers. A failed key comes back with a growing delay; a handler may ask to be called again."""

    def __init__(
        self, handler: Callable[[Any], Awaitable[float | None]], concurrency: int, what: str
    ) -> None:
        self.handler, self.concurrency, self.what = handler, concurrency, what
        self.queue: asyncio.Queue[Hashable] = asyncio.Queue()
        self.waiting: set[Hashable] = set()
        self.busy: set[Hashable] = set()
        self.again: set[Hashable] = set()
        self.failures: dict[Hashable, int] = {}
        self.errors: dict[Hashable, str] = {}

    def add(self, key: Hashable) -> None:
        if key in self.busy:
            self.again.add(key)
        elif key not in self.waiting:
            self.waiting.add(key)
            self.queue.put_nowait(key)

    def later(self, key: Hashable, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)

    async def worker(self) -> None:
        while True:
            key = await self.queue.get()
            self.waiting.discard(key)
            self.busy.add(key)
            try:
                delay = await self.handler(key)
                self.failures.pop(key, None)
                self.errors.pop(key, None)
                if delay is not None:
                    self.later(key, delay)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - retried; logged once per distinct error
                count = self.failures[key] = self.failures.get(key, 0) + 1
                message = describe(err)
                if self.errors.get(key) != message:
                    log.warning("%s %s: %s (retrying)", self.what, key, message)
                self.errors[key] = message
                self.later(key, min(0.5 * 2 ** min(count, 5), 10.0))
            finally:
                self.busy.discard(key)
                if key in self.again:
                    self.again.discard(key)
                    self.add(key)

    def tasks(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self.worker(), name=f"{self.what}-{i}") for i in range(self.concurrency)]


class NodeStandIns:
    """The node components' stand-ins (`players`) driven by one watch of their pods. With
    `identities` (`sim/standins/identity.py`) each player's `sync` gets a client with its component's
    identity (`Player.identity`): its pod's ServiceAccount token (the newest running pod, else the
    newest one still there), the node's kubelet once no pod is left (the kubelet's cleanup), no
    client at all for a player that makes no API call; without, the one `client` (unit tests)."""

    def __init__(
        self, client: AsyncClient, players: list[Player], concurrency: int = 16, identities: Any = None
    ) -> None:
        self.client, self.players = client, {p.app: p for p in players}
        self.identities = identities
        self.by_node: dict[tuple[str, str], dict[tuple[str, str], PodView]] = {}
        self.nodes: dict[str, StandinNodeView | None] = {}
        self.queue = WorkQueue(self.handle, concurrency, "stand-in")
        keys: dict[str, list[str]] = {}  # pod label key -> the components' values
        for player in players:
            keys.setdefault(getattr(player, "pod_label", "app"), []).append(player.app)
        self.watches = [
            Reflector(
                client,
                Pod,
                {key: in_(sorted(apps))},
                functools.partial(PodView.of, label=key),
                self.changed,
                "component pods" if key == "app" else f"{key} pods",
            )
            for key, apps in sorted(keys.items())
        ]

    def changed(self, old: PodView | None, new: PodView | None) -> None:
        for pod, present in ((old, False), (new, True)):
            if pod is None or not pod.node or pod.app not in self.players:
                continue
            key = (pod.app, pod.node)
            on_node = self.by_node.setdefault(key, {})
            if present:
                on_node[(pod.namespace, pod.name)] = pod
            else:
                on_node.pop((pod.namespace, pod.name), None)
            self.queue.add(key)
        if old is not None and new is None and self.identities is not None:
            self.identities.forget(old.uid)  # its token is bound to the pod: gone with it

    async def node(self, name: str) -> StandinNodeView | None:
        if name not in self.nodes:
            try:
                self.nodes[name] = StandinNodeView.of(await self.client.get(Node, name))
            except ApiError as err:
                if err.status.code != 404:
                    raise
                return None  # not cached: a node that joins later is looked up again
        return self.nodes[name]

    async def handle(self, key: tuple[str, str]) -> float | None:
        app, node = key
        pods = list(self.by_node.get(key, {}).values())
        if not pods:
            self.by_node.pop(key, None)
        view = await self.node(node)
        player = self.players[app]
        delay = await player.sync(await self.client_for(player, node, pods), node, view, pods)
        if not any(self.by_node.get((a, node)) for a in self.players):
            self.nodes.pop(node, None)  # no component left there: a Node of that name may be new next time
        return delay

    async def client_for(self, player: Player, node: str, pods: list[PodView]) -> Any:
        """The client `player` calls with on `node` (see the class)."""
        if self.identities is None:
            return self.client
        from gpu_operator.sim.standins import identity

        kind = getattr(player, "identity", None)
        if kind not in (identity.POD, identity.KUBELET, identity.NO_API):
            raise TypeError(
                f"the stand-in {type(player).__name__} (app={player.app}) declares no identity "
                f"(`identity` = {kind!r}): set it to sim/standins/identity.py's POD, KUBELET or NO_API"
            )
        if kind == identity.NO_API:
            return identity.NoCalls(player.app)
        ordered = sorted(pods, key=lambda p: (p.running, p.started, p.name))
        if ordered:
            try:
                return await self.identities.for_pod(ordered[-1], player.field_manager)
            except ApiError as err:  # the pod went meanwhile (its token can no longer be had)
                if err.status.code not in (403, 404):
                    raise
        return self.identities.kubelet_lazy(node, player.field_manager)

    def waker(self, app: str) -> Callable[[str], None]:
        return lambda node: self.queue.add((app, node))

    async def run(self) -> None:
        for player in self.players.values():
            attach = getattr(player, "attach", None)
            if attach is not None:
                attach(self.waker(player.app))
            if hasattr(player, "identities"):  # it also calls as the kubelet, or makes its own clients
                player.identities = self.identities
            await player.start(self.client)
        pods = [asyncio.create_task(watch.run(), name=watch.what) for watch in self.watches]
        await run_together([*pods, asyncio.create_task(self._work(), name="stand-in-workers")])

    async def _work(self) -> None:
        """The workers, once the pods are listed: a node a player asked for at its start (or a host
        change announced early) is looked at with its pods known, not as a node without them."""
        for watch in self.watches:
            await watch.synced.wait()
        await run_together(self.queue.tasks())
