"""The operator's connections to the apiserver (kube/client.py's transport, over TLS with the
simulator's PKI and a kubeconfig) stay open between two bursts of the label gate's width."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from pathlib import Path

import httpx2
from lightkube import KubeConfig

from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import _transport
from gpu_operator.sim.plane import pki as simpki
from tests.unit.kube.tlskit import admin_kubeconfig, server_tls

IN_FLIGHT = OperatorSettings().label_concurrency


async def _connections_for_two_bursts(
    pki: simpki.Pki, tmp_path: Path, transport: Callable[[str], httpx2.AsyncBaseTransport]
) -> int:
    """Two bursts of IN_FLIGHT concurrent requests through `transport(kubeconfig path)` against a
    local TLS server that holds each answer until the whole burst has arrived; returns how many
    connections it accepted."""
    accepted = arrived = open_connections = 0
    burst_in, all_closed = asyncio.Event(), asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted, arrived, open_connections
        accepted += 1
        open_connections += 1
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):  # the client closed it
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    arrived += 1
                    if arrived % IN_FLIGHT == 0:
                        burst_in.set()
                    await burst_in.wait()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    await writer.drain()
        finally:
            writer.close()
            open_connections -= 1
            if open_connections == 0:
                all_closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls(pki))
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    path = admin_kubeconfig(pki, tmp_path / "kubeconfig", url)
    async with server:
        async with httpx2.AsyncClient(transport=transport(str(path)), base_url=url) as client:
            for _ in range(2):
                burst_in.clear()
                answers = await asyncio.gather(*(client.get("/api/v1/nodes") for _ in range(IN_FLIGHT)))
                assert all(a.status_code == 200 for a in answers)
        await asyncio.wait_for(all_closed.wait(), 10)  # the client closed every connection it kept
    return accepted


def operators(path: str) -> httpx2.AsyncBaseTransport:
    config = KubeConfig.from_file(path).get()
    assert config is not None
    return _transport(config, lambda: None)


def test_the_label_gates_connections_stay_open_between_bursts(pki: simpki.Pki, tmp_path: Path) -> None:
    assert asyncio.run(_connections_for_two_bursts(pki, tmp_path, operators)) == IN_FLIGHT


def test_the_http_clients_default_pool_would_reopen_them(pki: simpki.Pki, tmp_path: Path) -> None:
    """The check above can fail: with the HTTP client's default pool (100 connections, 20 kept
    idle) the second burst opens 12 connections again."""

    def default(_: str) -> httpx2.AsyncBaseTransport:
        return httpx2.AsyncHTTPTransport(verify=ssl.create_default_context(cafile=str(pki.ca_cert)))

    assert asyncio.run(_connections_for_two_bursts(pki, tmp_path, default)) == IN_FLIGHT + (IN_FLIGHT - 20)
