"""The Node watch, as HTTP: one paged list (the shared HTTP client), then one watch resumed from
the last resourceVersion (bookmarks keep it current) on a line stream of its own
(kube/linestream.py: kubelet or kwok heartbeats, one event per node every few minutes, are the
operator's steadiest cost while idle), a fresh list when the apiserver answers 410 Gone, the
caller's backoff on any other failure. Each Node is decoded straight into the few fields the
operator reads (msgspec skips the rest of the body without building it); the caller's view is
made again only when those fields changed (a hash of them per node), and only a view that
changed is reported: a heartbeat costs one decode, one encode and a hash."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import httpx2
import msgspec
from prometheus_client import Counter

from gpu_operator.kube.linestream import LineStreams, StreamStatusError

log = logging.getLogger("gpu_operator.reflector")

EVENTS = Counter("gpu_operator_node_watch_events", "Node watch events received, by type", ["type"])
LISTS = Counter("gpu_operator_node_lists", "Full Node lists, by reason (start, gone)", ["reason"])

NODES_PATH = "/api/v1/nodes"


class _Meta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _NodeInfo(msgspec.Struct):
    kernelVersion: str = ""
    containerRuntimeVersion: str = ""
    kubeletVersion: str = ""


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""  # heartbeat times are skipped: a heartbeat changes no view
    reason: str = ""  # (reason and message: the GPU health signals compare their own condition)
    message: str = ""


class _Status(msgspec.Struct):
    nodeInfo: _NodeInfo | None = None
    conditions: list[_Condition] | None = None


class _Taint(msgspec.Struct):
    key: str = ""
    effect: str = ""
    value: str = ""


class _Spec(msgspec.Struct):
    unschedulable: bool = False
    taints: list[_Taint] | None = None


class SlimNode(msgspec.Struct):
    """The part of a Node the decoder builds; every other field is skipped."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec | None = None
    status: _Status | None = None


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str | None = msgspec.field(name="continue", default=None)


class _NodeList(msgspec.Struct):
    items: list[SlimNode] | None = None
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _ErrorStatus(msgspec.Struct):
    code: int = 0
    message: str = ""
    reason: str = ""


_decode_list = msgspec.json.Decoder(_NodeList).decode
_decode_event = msgspec.json.Decoder(_Event).decode
_decode_node = msgspec.json.Decoder(SlimNode).decode
_decode_error = msgspec.json.Decoder(_ErrorStatus).decode
_encode = msgspec.json.Encoder().encode


class Gone(Exception):
    """The resourceVersion the watch resumed from is too old (HTTP 410): list again."""


V = TypeVar("V")
OnChange = Callable[[str, V | None], None]


class NodeWatch(Generic[V]):
    """Keeps `views` (node name -> the view `to_view` makes of a decoded Node) equal to the
    apiserver's Nodes; calls `on_change(name, view)` for a new or changed view and
    `on_change(name, None)` for a node that is gone. `synced` is set once the first list is in.
    `delay(n)` is the wait after the n-th failure in a row."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        streams: LineStreams,
        on_change: OnChange[V],
        to_view: Callable[[SlimNode], V],
        *,
        delay: Callable[[int], float],
        page_size: int = 500,
        server_timeout: float = 300,
        connect_timeout: float = 30,
        path: str = NODES_PATH,
    ) -> None:
        self.http = http
        self.streams = streams
        self.on_change = on_change
        self.to_view = to_view
        self.delay = delay
        self.page_size = page_size
        self.server_timeout = server_timeout
        self.connect_timeout = connect_timeout
        self.path = path
        self.views: dict[str, V] = {}
        # Per node, a hash of what was decoded of it (its resourceVersion left out) when its view
        # was last made: a heartbeat decodes to the same fields, so it skips making the view.
        self.decoded: dict[str, int] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()

    def _node(self, node: SlimNode) -> None:
        """A listed or watched Node: its view made again only when a field it is made of changed."""
        name, version = node.metadata.name, node.metadata.resourceVersion
        node.metadata.resourceVersion = ""
        fingerprint = hash(_encode(node))
        node.metadata.resourceVersion = version
        if name in self.views and self.decoded.get(name) == fingerprint:
            return
        self.decoded[name] = fingerprint
        self._apply(name, self.to_view(node))

    def _apply(self, name: str, view: V | None) -> None:
        if view is None:
            self.decoded.pop(name, None)
            if self.views.pop(name, None) is not None:
                self.on_change(name, None)
            return
        if self.views.get(name) != view:
            self.views[name] = view
            self.on_change(name, view)

    async def list(self) -> str:
        """One consistent paged list; replaces the store and reports the differences. Returns
        the list's resourceVersion."""
        seen: set[str] = set()
        params: dict[str, Any] = {"limit": self.page_size}
        version = ""
        while True:
            response = await self.http.get(self.path, params=params, timeout=self._timeout(60))
            if response.status_code == 410:  # the continue token expired mid-list: start over
                params, seen = {"limit": self.page_size}, set()
                continue
            response.raise_for_status()
            page = _decode_list(response.content)
            version = version or page.metadata.resourceVersion
            for node in page.items or ():
                seen.add(node.metadata.name)
                self._node(node)
            if not page.metadata.continue_:
                break
            params = {"limit": self.page_size, "continue": page.metadata.continue_}
        for name in set(self.views) - seen:
            self._apply(name, None)
        self.resource_version = version
        self.synced.set()
        return version

    def _timeout(self, read: float | None) -> httpx2.Timeout:
        return httpx2.Timeout(self.connect_timeout, read=read)

    async def watch(self) -> None:
        """One watch request from `resource_version`, until the server ends it (returns normally),
        it fails (raises), or the version is too old (raises Gone)."""
        # Spread the restarts of many watches, as client-go does (between 1x and 2x the minimum).
        timeout = int(self.server_timeout * (1 + random.random()))
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(timeout),
        }
        try:
            await self.streams.stream(
                self.path,
                params,
                self.handle_line,
                connect_timeout=self.connect_timeout,
                timeout=timeout + 30,
            )
        except StreamStatusError as err:
            if err.status == 410:
                raise Gone(f"HTTP 410 for resourceVersion {self.resource_version}") from None
            raise

    def handle_line(self, line: bytes) -> None:
        event = _decode_event(line)
        EVENTS.labels(event.type).inc()
        if event.type == "ERROR":
            status = _decode_error(event.object)
            if status.code == 410:
                raise Gone(status.message or "too old resource version")
            raise RuntimeError(
                f"Node watch error event: HTTP {status.code} {status.reason}: {status.message}"
            )
        node = _decode_node(event.object)
        if node.metadata.resourceVersion:
            self.resource_version = node.metadata.resourceVersion
        if event.type == "BOOKMARK":
            return
        if event.type == "DELETED":
            self._apply(node.metadata.name, None)
        else:
            self._node(node)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """List, then watch and resume, forever (or until `stop`)."""
        stop = stop or asyncio.Event()
        failures = 0
        reason = "start"
        while not stop.is_set():
            try:
                if reason:
                    LISTS.labels(reason).inc()
                    await self.list()
                    reason = ""
                if not await _unless_stopped(self.watch(), stop):
                    return
                failures = 0
            except asyncio.CancelledError:
                raise
            except Gone as err:
                log.info("Node watch: %s; listing the nodes again", err)
                reason = "gone"
                failures = 0
            except Exception as err:  # network, 5xx, a malformed line: back off, resume the watch
                failures += 1
                delay = self.delay(failures)
                if not self.synced.is_set():
                    reason = "start"
                elif isinstance(err, httpx2.HTTPStatusError) and err.response.status_code == 410:
                    reason = "gone"
                log.warning(
                    "Node %s failed (%d in a row): %s; retrying in %.1f s",
                    "list" if reason else "watch",
                    failures,
                    err or type(err).__name__,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)


async def _unless_stopped(work: Any, stop: asyncio.Event) -> bool:
    """Await `work` (a coroutine) unless `stop` is set first: then it is cancelled and False is
    returned. A watch waits on its stream for minutes between events; a shutdown must not."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if stop.is_set() and task.cancelled():
        return False
    task.result()  # its exception, if it raised
    return True
