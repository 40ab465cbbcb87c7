"""A kind watched as HTTP and decoded slim: one paged list (the shared HTTP client), then one watch
resumed from the last resourceVersion (bookmarks keep it current) on a line stream of its own
(kube/linestream.py), a fresh list when the apiserver answers 410 Gone, the caller's backoff on any
other failure. Each object is decoded straight into the few fields the operator reads (a msgspec
Struct: the rest of the body is skipped without being built); the caller's view is made again only
when those fields changed (a hash of them per object), and only a view that changed is reported:
an event that changes nothing the operator reads (a Node's heartbeat, a pod's status timestamps)
costs one decode, one encode and a hash.

Two kinds are watched this way: Nodes (kube/nodewatch.py) and driver pods (kube/podwatch.py), the
two kinds with an event per node that the operator reads a handful of fields of."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import httpx2
import msgspec
from prometheus_client import Counter

from gpu_operator.kube.linestream import LineStreams, StreamStatusError

log = logging.getLogger("gpu_operator.reflector")


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str | None = msgspec.field(name="continue", default=None)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _ErrorStatus(msgspec.Struct):
    code: int = 0
    message: str = ""
    reason: str = ""


class _NamedVersion(Protocol):
    name: str
    resourceVersion: str


class Slim(Protocol):
    """What a watched kind's Struct has: its metadata's name and resourceVersion."""

    @property
    def metadata(self) -> _NamedVersion: ...


T = TypeVar("T", bound=Slim)
V = TypeVar("V")
OnChange = Callable[[str, V | None], None]  # a Node watch's caller: the new view, None when gone
OnViewChange = Callable[[str, V | None, V | None], None]  # (name, view or None when gone, the view before)


class SlimList(msgspec.Struct, Generic[T]):
    """One page of a list: its items, decoded as the kind's Struct."""

    items: list[T] | None = None
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


class Decoders(Generic[T]):
    """A kind's decoders, built once (at import of the kind's module: msgspec builds a type's
    decoding info then, in one thread; node/cluster/kubetypes.py says why that matters)."""

    def __init__(self, item: type[T]) -> None:
        self.list: Callable[[bytes], SlimList[T]] = msgspec.json.Decoder(SlimList[item]).decode  # type: ignore[valid-type]
        self.item: Callable[[bytes], T] = msgspec.json.Decoder(item).decode


_decode_event = msgspec.json.Decoder(_Event).decode
_decode_error = msgspec.json.Decoder(_ErrorStatus).decode
_encode = msgspec.json.Encoder().encode


class Gone(Exception):
    """The resourceVersion the watch resumed from is too old (HTTP 410): list again."""


class Counters:
    """A watch's two counters: events by type, full lists by reason (start, gone)."""

    def __init__(self, events: Counter, lists: Counter) -> None:
        self.events, self.lists = events, lists


class SlimWatch(Generic[T, V]):
    """Keeps `views` (object name -> the view `to_view` makes of a decoded object) equal to the
    apiserver's objects at `path` (with `selector`, a label selector, when given); calls
    `on_change(name, view, old)` for a view that appeared (`old` None), changed, or went (`view`
    None, `old` its last view). `synced` is set once the first list is in. `delay(n)` is the wait after the n-th failure in a row. `what` names the kind in logs."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        streams: LineStreams,
        on_change: OnViewChange[V],
        to_view: Callable[[T], V],
        *,
        decoders: Decoders[T],
        counters: Counters,
        what: str,
        path: str,
        selector: str = "",
        delay: Callable[[int], float],
        page_size: int = 500,
        server_timeout: float = 300,
        connect_timeout: float = 30,
    ) -> None:
        self.http = http
        self.streams = streams
        self.on_change = on_change
        self.to_view = to_view
        self.decoders = decoders
        self.counters = counters
        self.what = what
        self.path = path
        self.selector = selector
        self.delay = delay
        self.page_size = page_size
        self.server_timeout = server_timeout
        self.connect_timeout = connect_timeout
        self.views: dict[str, V] = {}
        # Per object, a hash of what was decoded of it (its resourceVersion left out) when its view
        # was last made: an event that changes none of those fields skips making the view.
        self.decoded: dict[str, int] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()

    def _object(self, item: T) -> None:
        """A listed or watched object: its view made again only when a field it is made of changed."""
        meta = item.metadata
        name, version = meta.name, meta.resourceVersion
        meta.resourceVersion = ""
        fingerprint = hash(_encode(item))
        meta.resourceVersion = version
        if name in self.views and self.decoded.get(name) == fingerprint:
            return
        self.decoded[name] = fingerprint
        self._apply(name, self.to_view(item))

    def _apply(self, name: str, view: V | None) -> None:
        if view is None:
            self.decoded.pop(name, None)
            old = self.views.pop(name, None)
            if old is not None:
                self.on_change(name, None, old)
            return
        old = self.views.get(name)
        if old != view:
            self.views[name] = view
            self.on_change(name, view, old)

    def _params(self, **params: Any) -> dict[str, Any]:
        return {**({"labelSelector": self.selector} if self.selector else {}), **params}

    async def list(self) -> str:
        """One consistent paged list; replaces the store and reports the differences. Returns
        the list's resourceVersion."""
        seen: set[str] = set()
        params = self._params(limit=self.page_size)
        version = ""
        while True:
            response = await self.http.get(self.path, params=params, timeout=self._timeout(60))
            if response.status_code == 410:  # the continue token expired mid-list: start over
                params, seen = self._params(limit=self.page_size), set()
                continue
            response.raise_for_status()
            page = self.decoders.list(response.content)
            version = version or page.metadata.resourceVersion
            for item in page.items or ():
                seen.add(item.metadata.name)
                self._object(item)
            if not page.metadata.continue_:
                break
            params = self._params(limit=self.page_size, **{"continue": page.metadata.continue_})
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
        params = self._params(
            watch="true",
            allowWatchBookmarks="true",
            resourceVersion=self.resource_version,
            timeoutSeconds=str(timeout),
        )
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
        self.counters.events.labels(event.type).inc()
        if event.type == "ERROR":
            status = _decode_error(event.object)
            if status.code == 410:
                raise Gone(status.message or "too old resource version")
            raise RuntimeError(
                f"{self.what} watch error event: HTTP {status.code} {status.reason}: {status.message}"
            )
        item = self.decoders.item(event.object)
        if item.metadata.resourceVersion:
            self.resource_version = item.metadata.resourceVersion
        if event.type == "BOOKMARK":
            return
        if event.type == "DELETED":
            self._apply(item.metadata.name, None)
        else:
            self._object(item)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """List, then watch and resume, forever (or until `stop`)."""
        stop = stop or asyncio.Event()
        failures = 0
        reason = "start"
        while not stop.is_set():
            try:
                if reason:
                    self.counters.lists.labels(reason).inc()
                    await self.list()
                    reason = ""
                if not await _unless_stopped(self.watch(), stop):
                    return
                failures = 0
            except asyncio.CancelledError:
                raise
            except Gone as err:
                log.info("%s watch: %s; listing again", self.what, err)
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
                    "%s %s failed (%d in a row): %s; retrying in %.1f s",
                    self.what,
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
