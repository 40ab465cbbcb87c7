"""Long-lived GET streams of newline-delimited JSON (watches), read on their own HTTP/1.1
connection with h11 straight from the event loop's TLS transport.

Why not the shared HTTP client: a watch event is a few KB that arrives alone, so what it costs is
the per-read path, not the bytes. Through the HTTP client's stream iterators one event passed about
ten async generator layers, a timeout scope per read and a text and a line decoder (~0.5 ms of CPU
per Node heartbeat, measured); here the transport hands each TLS read to h11 and complete lines
go to the caller's function synchronously (about half of that, bench/README.md). Everything else
(lists, writes) stays on the shared client.

The server, TLS settings and credentials come from the same kubeconfig as every other request
(lightkube's `client_adapter`), the Authorization header through the same auth flow, so a 401
re-reads a rotated token file as the shared client would."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import h11
import httpx2
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import SingleConfig

USER_AGENT = "gpu-operator"
ERROR_BODY_LIMIT = 64 * 1024


class StreamStatusError(Exception):
    """The server answered the stream's request with a non-2xx status; `body` is its start."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status = status
        self.body = body


OnLine = Callable[[bytes], None]


class _LineReader(asyncio.Protocol):
    """One request's response: status and headers, then each complete body line to `on_line`.
    `done` resolves when the response ends, the connection drops or `on_line` raises."""

    def __init__(self, conn: h11.Connection, request: bytes, on_line: OnLine) -> None:
        self.conn = conn  # the connection `request` was made with: h11 expects its response
        self.request = request
        self.on_line = on_line
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.partial = bytearray()  # the body after its last newline
        self.error_body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        try:
            self.conn.receive_data(data)
            self._events()
        except Exception as err:  # a protocol error, or the caller's on_line refused a line
            self._finish(err)

    def eof_received(self) -> bool | None:
        try:
            self.conn.receive_data(b"")
            self._events()
        except Exception as err:
            self._finish(err)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionError("the server closed the stream's connection"))

    def _events(self) -> None:
        while not self.done.done():
            event = self.conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                self.status = event.status_code
                encoding = dict(event.headers).get(b"content-encoding", b"identity")
                if 200 <= self.status < 300 and encoding != b"identity":
                    raise ValueError(f"the stream came {encoding.decode()}-encoded; it asked for identity")
            elif isinstance(event, h11.Data):
                if 200 <= self.status < 300:
                    self._lines(event.data)
                elif len(self.error_body) < ERROR_BODY_LIMIT:
                    self.error_body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if 200 <= self.status < 300:
                    self._lines(b"\n")  # a last line without its newline
                    self._finish(None)
                else:
                    self._finish(StreamStatusError(self.status, self.error_body))
            elif isinstance(event, h11.ConnectionClosed):
                self._finish(ConnectionError("the server closed the stream's connection"))

    def _lines(self, data: bytes) -> None:
        self.partial += data  # a bytearray: a large object in many reads is not copied per read
        if b"\n" not in data:
            return
        lines = bytes(self.partial).split(b"\n")
        self.partial = bytearray(lines.pop())
        for line in lines:
            if line:
                self.on_line(line)

    def _finish(self, error: BaseException | None) -> None:
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
        if self.transport is not None:
            self.transport.close()


class LineStreams:
    """Opens line streams to one apiserver, each on a connection of its own."""

    def __init__(self, config: SingleConfig) -> None:
        self.url = httpx2.URL(config.cluster.server)
        self.tls: ssl.SSLContext | None = None
        if self.url.scheme == "https":
            if config.user is None:
                raise ValueError(
                    "the kubeconfig's context names no user: add one with credentials for the apiserver"
                )
            self.tls = client_adapter.verify_cluster(config.cluster, config.user, config.abs_file)
            self.tls.set_alpn_protocols(["http/1.1"])
        self.auth = client_adapter.user_auth(config.user)

    async def stream(
        self, path: str, params: Mapping[str, str], on_line: OnLine, *, connect_timeout: float, timeout: float
    ) -> None:
        """GET `path` and hand each line of the body to `on_line` until the server ends the
        response (returns), `timeout` seconds pass or the connection fails (raises), or the
        status is not 2xx (raises StreamStatusError). A 401 is retried once through the auth
        flow (a token file is read again)."""
        base = self.url.raw_path.decode().rstrip("/")
        url = self.url.copy_with(raw_path=(base + path).encode()).copy_merge_params(dict(params))
        request = httpx2.Request("GET", url, headers={"Accept": "application/json", "User-Agent": USER_AGENT})
        flow = self.auth.async_auth_flow(request) if self.auth is not None else None
        if flow is not None:
            request = await flow.__anext__()
        try:
            await self._send(request, on_line, connect_timeout, timeout)
        except StreamStatusError as err:
            if err.status != 401 or flow is None:
                raise
            try:  # the flow decides: a token file is read again; a fixed token has nothing new
                request = await flow.asend(httpx2.Response(401, request=request))
            except StopAsyncIteration:
                raise err from None
            await self._send(request, on_line, connect_timeout, timeout)

    async def _send(
        self, request: httpx2.Request, on_line: OnLine, connect_timeout: float, timeout: float
    ) -> None:
        conn = h11.Connection(h11.CLIENT)
        headers = list(request.headers.items())  # Host included, as the request set it
        wire = conn.send(h11.Request(method="GET", target=request.url.raw_path, headers=headers)) or b""
        wire += conn.send(h11.EndOfMessage()) or b""
        reader = _LineReader(conn, wire, on_line)
        loop = asyncio.get_running_loop()
        port = self.url.port or (443 if self.tls is not None else 80)
        extra: dict[str, Any] = {"ssl": self.tls, "server_hostname": self.url.host} if self.tls else {}
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: reader, self.url.host, port, **extra), timeout=connect_timeout
        )
        try:
            await asyncio.wait_for(reader.done, timeout=timeout)
        finally:
            transport.close()
