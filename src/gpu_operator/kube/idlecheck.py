"""The connection pool's idle check, made cheap: the HTTP client's pool asks every idle connection
whether the server closed it (`get_extra_info("is_readable")`) each time a request enters or a
response is closed, and on the default backend each answer rebuilds the TLS stream's and the
socket stream's attribute tables (a dozen closures and a `getpeername` call) to find the socket.
With the operator's pool (tens of connections kept open to the apiserver) a 1,000-node run made
81,441 such checks in 8,596 passes of the pool, 6 % of the operator's profiled time (bench/README.md,
2026-12-03). Here each connection's socket is looked up once; the check itself is the same poll of
it."""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2

SocketOption = Any  # httpcore's SOCKET_OPTION (a tuple of level, option, value)


def readable(sock: socket.socket | None) -> bool:
    """Whether a read on the socket would return at once (data, or the end: the server closed it).
    A socket that is gone or closed counts as readable, as the pool's own check has it."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


class IdleCheckStream(httpcore2.AsyncNetworkStream):
    """A connection's stream whose readability check finds the socket once (`lookups` counts
    the look-ups, for tests)."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self.inner = inner
        self._socket: socket.socket | None = None
        self.lookups = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        return IdleCheckStream(await self.inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        if info != "is_readable":
            return self.inner.get_extra_info(info)
        if self._socket is None:
            self.lookups += 1
            self._socket = self.inner.get_extra_info("socket")
        return readable(self._socket)


class IdleCheckBackend(httpcore2.AsyncNetworkBackend):
    """The pool's network backend (httpcore's default one underneath), its streams `IdleCheckStream`s."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self.inner = inner or httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return IdleCheckStream(
            await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[SocketOption] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        return IdleCheckStream(await self.inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)
