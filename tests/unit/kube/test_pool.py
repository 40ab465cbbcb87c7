"""The operator's connection pool keeps a label pass's connections open between bursts."""

from __future__ import annotations

import asyncio
import contextlib

import httpx2

from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import POOL


async def _connections_for_two_bursts(limits: httpx2.Limits, in_flight: int) -> int:
    """Two bursts of `in_flight` concurrent requests against a local HTTP/1.1 server that holds
    each answer until the whole burst has arrived; returns how many connections it accepted."""
    accepted = 0
    arrived = 0
    burst_in = asyncio.Event()

    open_connections = 0
    all_closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted, arrived, open_connections
        accepted += 1
        open_connections += 1
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):  # the client closed it
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    arrived += 1
                    if arrived % in_flight == 0:
                        burst_in.set()
                    await burst_in.wait()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    await writer.drain()
        finally:
            writer.close()
            open_connections -= 1
            if open_connections == 0:
                all_closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(limits=limits)) as client:
            for _ in range(2):
                burst_in.clear()
                answers = await asyncio.gather(*(client.get(f"http://127.0.0.1:{port}/") for _ in range(in_flight)))
                assert all(a.status_code == 200 for a in answers)
        await asyncio.wait_for(all_closed.wait(), 10)  # the client closed every connection it kept
    return accepted


def test_the_label_gates_connections_stay_open_between_bursts() -> None:
    in_flight = OperatorSettings().label_concurrency
    assert asyncio.run(_connections_for_two_bursts(POOL, in_flight)) == in_flight


def test_the_http_clients_default_pool_would_reopen_them() -> None:
    """The check above can fail: with the HTTP client's default pool (100 connections, 20 kept
    idle) the second burst opens 12 connections again."""
    in_flight = OperatorSettings().label_concurrency
    default = httpx2.Limits(max_connections=100, max_keepalive_connections=20)
    assert asyncio.run(_connections_for_two_bursts(default, in_flight)) == in_flight + (in_flight - 20)
