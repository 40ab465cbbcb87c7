"""The apiserver's egress proxy (sim/plane/egress.py): CONNECT relays bytes both ways, anything else is
refused with a status, a dead target is a 502, and routes pick the real node's namespace by
address. Crossing into another network namespace needs root and a real node:
tests/integration/test_real_node_debugging.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.sim.plane.egress import egress_config, handler, netns_for, register


def test_routes_pick_the_namespace_holding_the_address(tmp_path: Path) -> None:
    register(tmp_path, "real-node-0", "/proc/42/ns/net", ["10.2.0.1/32", "10.88.0.0/16"])
    assert netns_for(tmp_path, "10.2.0.1") == "/proc/42/ns/net"
    assert netns_for(tmp_path, "10.88.3.7") == "/proc/42/ns/net"
    assert netns_for(tmp_path, "10.1.0.1") is None  # a kwok node's address: dialled here
    assert netns_for(tmp_path, "real-node-0") is None  # names are not routed
    (tmp_path / "broken.json").write_text("{not json")
    assert netns_for(tmp_path, "10.2.0.1") == "/proc/42/ns/net"


def test_the_apiserver_config_sends_only_cluster_traffic_to_the_proxy() -> None:
    config: dict[str, Any] = egress_config(Path("/run/sim/egress.sock"))
    (selection,) = config["egressSelections"]
    assert selection["name"] == "cluster"
    assert selection["connection"] == {
        "proxyProtocol": "HTTPConnect",
        "transport": {"uds": {"udsName": "/run/sim/egress.sock"}},
    }


@contextlib.asynccontextmanager
async def _servers(tmp_path: Path) -> AsyncIterator[tuple[int, int]]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:" + await reader.readline())
        await writer.drain()
        writer.close()

    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = await asyncio.start_server(handler(tmp_path), "127.0.0.1", 0)
    try:
        yield proxy.sockets[0].getsockname()[1], target.sockets[0].getsockname()[1]
    finally:
        proxy.close()
        target.close()


async def _ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


def _status(response: bytes) -> int:
    return int(response.split(b"\r\n", 1)[0].split()[1])


def test_connect_relays_both_ways(tmp_path: Path) -> None:
    async def go() -> bytes:
        async with _servers(tmp_path) as (proxy, target):
            return await _ask(proxy, f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: x\r\n\r\nping\n".encode())

    response = asyncio.run(go())
    assert _status(response) == 200
    assert response.endswith(b"\r\n\r\necho:ping\n")


@pytest.mark.parametrize(
    ("request_line", "status"), [("GET / HTTP/1.1", 405), ("CONNECT {dead} HTTP/1.1", 502)]
)
def test_what_cannot_be_relayed_gets_a_status(tmp_path: Path, request_line: str, status: int) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"

    async def go() -> bytes:
        async with _servers(tmp_path) as (proxy, _):
            return await _ask(proxy, request_line.format(dead=dead).encode() + b"\r\n\r\n")

    response = asyncio.run(go())
    assert _status(response) == status, response
