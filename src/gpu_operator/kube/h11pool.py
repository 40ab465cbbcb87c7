"""The HTTP/1.1 connection pool every request/response exchange with the apiserver goes through
(lists, gets, writes; watches have their own connections, kube/linestream.py): h11 on the event
loop's own TLS transports, under the HTTP client's API (an `httpx2.AsyncBaseTransport`).

Why not the HTTP client's default transport: its cost per request, not per byte. A 1,000-node
rollout makes ~6,400 writes plus its reads, and in its profile the client's stack (httpcore's
pool, anyio's streams, their timeouts and idle checks) was 27-30 % of the operator's CPU
(bench/README.md, "Where the operator's CPU goes now"): before each request the pool asked every
idle connection whether the server had closed it, through anyio's attribute tables. Here a
connection is an `asyncio.Protocol`: the loop reports a close when it happens (the connection
leaves the pool then), bytes go straight to h11, and a request waits on one future.

What it keeps from the default transport: at most `max_connections` open (more requests wait for
one, or fail with PoolTimeout after the pool timeout), idle connections reused and closed after
`keepalive_expiry` seconds, the request's connect/read/pool timeouts, the `trace` extension's
`http11.send_request_headers.started` event (the leader fence checks there, kube/client.py), and
the HTTP client's exception types (ConnectError, ConnectTimeout, ReadTimeout, RemoteProtocolError,
ReadError, PoolTimeout). A request sent on a reused connection that the server closed before
answering is sent again on a new one when it is a read (GET, HEAD, OPTIONS); a write fails (it
may have been applied), as with the default transport."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx2

READS = frozenset({b"GET", b"HEAD", b"OPTIONS"})


class _Closed(Exception):
    """The connection closed (`before_answer`: before any byte of a response)."""

    def __init__(self, before_answer: bool, cause: BaseException | None) -> None:
        super().__init__("the server closed the connection")
        self.before_answer = before_answer
        self.__cause__ = cause


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: h11's state, the loop's transport, and the one waiter of the
    request in flight (the exchange is strictly one request at a time)."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.answered = False  # a byte of the current response came
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.idle_since = 0.0
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.h11.receive_data(data)
        except h11.RemoteProtocolError as err:
            self.error = err
        self._wake()

    def eof_received(self) -> bool | None:
        if not self.answered:
            # closed before any byte of an answer (or while idle): a close to retry on, not one for
            # h11 (it would end the exchange with its own RemoteProtocolError, never retried)
            self.error = _Closed(True, None)
        else:
            try:
                self.h11.receive_data(b"")
            except h11.RemoteProtocolError as err:
                self.error = err
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.error is None:
            self.error = _Closed(not self.answered, exc)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def send(self, *events: h11.Request | h11.Data | h11.EndOfMessage) -> None:
        assert self.transport is not None
        wire = b"".join(self.h11.send(event) or b"" for event in events)
        self.answered = False
        self.transport.write(wire)

    async def next_event(self, timeout: float | None) -> Any:
        """h11's next event, waiting up to `timeout` seconds for bytes."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.error is not None:
                raise self.error
            self.waiter = self.loop.create_future()
            timer = None if timeout is None else self.loop.call_later(timeout, self._expire, self.waiter)
            try:
                await self.waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()

    @staticmethod
    def _expire(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(httpx2.ReadTimeout("no answer from the apiserver within the read timeout"))

    def reusable(self) -> bool:
        return not self.closed and self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.loop.is_closed():
            self.transport.close()


class H11Pool(httpx2.AsyncBaseTransport):
    """Connections to one apiserver (`server`: its URL; `tls`: None for plain HTTP)."""

    def __init__(
        self,
        server: str,
        tls: ssl.SSLContext | None,
        *,
        max_connections: int = 100,
        keepalive_expiry: float = 60.0,
    ) -> None:
        url = httpx2.URL(server)
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = tls
        if tls is not None:
            tls.set_alpn_protocols(["http/1.1"])
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiting: list[asyncio.Future[None]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()  # lightkube's and our requests carry their body in memory
        method = request.method.encode()
        head = h11.Request(method=method, target=request.url.raw_path, headers=request.headers.raw)
        for attempt in range(2):
            conn, reused = await self._acquire(timeouts)
            try:
                trace = request.extensions.get("trace")
                if trace is not None:
                    await trace("http11.send_request_headers.started", {"request": request})
                conn.send(head, *([h11.Data(data=body)] if body else []), h11.EndOfMessage())
                answer = await conn.next_event(timeouts.get("read"))
            except _Closed as err:
                self.discard(conn)
                if attempt == 0 and reused and err.before_answer and method in READS:
                    continue  # the server closed an idle connection as we reused it: a read is safe to send again
                raise httpx2.RemoteProtocolError(
                    "the apiserver closed the connection without an answer"
                ) from err
            except h11.ProtocolError as err:
                self.discard(conn)
                raise httpx2.RemoteProtocolError(str(err)) from err
            except BaseException:
                self.discard(conn)
                raise
            if not isinstance(answer, h11.Response):
                self.discard(conn)
                raise httpx2.RemoteProtocolError(f"unexpected HTTP event {answer!r}")
            return httpx2.Response(
                answer.status_code,
                headers=answer.headers.raw_items(),
                stream=_Body(self, conn, timeouts.get("read")),
                extensions={"http_version": b"HTTP/1.1", "reason_phrase": answer.reason},
            )
        raise AssertionError("unreachable")

    async def _acquire(self, timeouts: dict[str, float | None]) -> tuple[_Connection, bool]:
        loop = asyncio.get_running_loop()
        deadline = None if timeouts.get("pool") is None else loop.time() + float(timeouts["pool"] or 0)
        while True:
            now = time.monotonic()
            while self.idle:
                conn = self.idle.pop()
                if conn.closed or conn.loop is not loop or now - conn.idle_since > self.keepalive_expiry:
                    self.discard(conn)
                    continue
                return conn, True
            if self.open < self.max_connections:
                self.open += 1
                try:
                    return await self._connect(timeouts.get("connect")), False
                except BaseException:
                    self.open -= 1
                    self._wake_one()
                    raise
            waiter: asyncio.Future[None] = loop.create_future()
            self.waiting.append(waiter)
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                raise httpx2.PoolTimeout("every connection to the apiserver stayed busy") from None
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the next waiter gets the free connection
                raise
            finally:
                if waiter in self.waiting:
                    self.waiting.remove(waiter)

    async def _connect(self, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        extra: dict[str, Any] = {"ssl": self.tls, "server_hostname": self.host} if self.tls else {}
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port, **extra), timeout
            )
        except TimeoutError:
            raise httpx2.ConnectTimeout(
                f"no connection to {self.host}:{self.port} within {timeout} s"
            ) from None
        except OSError as err:
            raise httpx2.ConnectError(f"connecting to {self.host}:{self.port}: {err}") from err
        return conn

    def release(self, conn: _Connection) -> None:
        if conn.reusable() and conn.loop is asyncio.get_running_loop():
            conn.h11.start_next_cycle()
            conn.answered = False
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
            self._wake_one()
        else:
            self.discard(conn)

    def discard(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        conn.close()
        self.open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self.waiting:
            waiter = self.waiting.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in self.idle:
            conn.close()
        self.open -= len(self.idle)
        self.idle.clear()


class _Body(httpx2.AsyncByteStream):
    """A response's body, read from its connection as the caller iterates; at its end the
    connection goes back to the pool, and a body left unread closes it."""

    def __init__(self, pool: H11Pool, conn: _Connection, timeout: float | None) -> None:
        self.pool, self.conn, self.timeout = pool, conn, timeout
        self.done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while not self.done:
            try:
                event = await self.conn.next_event(self.timeout)
            except _Closed as err:
                self._end(False)
                raise httpx2.ReadError("the apiserver closed the connection mid-answer") from err
            except h11.ProtocolError as err:
                self._end(False)
                raise httpx2.RemoteProtocolError(str(err)) from err
            except BaseException:
                self._end(False)
                raise
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._end(True)
            else:
                self._end(False)
                raise httpx2.RemoteProtocolError(f"unexpected HTTP event {event!r}")

    def _end(self, complete: bool) -> None:
        if self.done:
            return
        self.done = True
        if complete:
            self.pool.release(self.conn)
        else:
            self.pool.discard(self.conn)

    async def aclose(self) -> None:
        self._end(False)
