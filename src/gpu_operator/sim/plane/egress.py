"""The apiserver's way to the real node: its `cluster` egress (kubelet logs, exec, port-forward,
the pods/services proxy) goes through this HTTP CONNECT proxy, as it goes through konnectivity on
clusters whose apiserver cannot route to the nodes. The real node lives in a network namespace of
its own (sim/realnode/nodens.py), which the machine's 127.0.0.1, where the apiserver listens, cannot reach.

A real node registers its networks in a routes directory: `<name>.json` with
`{"netns": "/proc/<pid>/ns/net", "cidrs": ["10.2.0.1/32", ...]}`. For `CONNECT host:port` the
proxy opens the connection inside the network namespace whose networks hold `host`, or in its own
for any other address; it answers 200 and then relays bytes both ways.

    python -m gpu_operator.sim.plane.egress SOCKET_PATH ROUTES_DIR
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import sys
from pathlib import Path

from gpu_operator.sim.realnode.nsproxy import in_netns, pipe, split_address


def egress_config(socket_path: Path) -> dict[str, object]:
    """The apiserver's EgressSelectorConfiguration: only `cluster` traffic, to the proxy's unix
    socket (a TCP transport without TLS crashes kube-apiserver 1.36 at start: nil TLS config)."""
    return {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [
            {
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": str(socket_path)}},
                },
            }
        ],
    }


def register(routes: Path, name: str, netns: str, cidrs: list[str]) -> Path:
    routes.mkdir(parents=True, exist_ok=True)
    path = routes / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"netns": netns, "cidrs": cidrs}))
    tmp.replace(path)
    return path


def netns_for(routes: Path, host: str) -> str | None:
    """The network namespace that holds `host`, from the registered routes; None: our own."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: resolved and dialled here
    for path in sorted(routes.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if any(address in ipaddress.ip_network(c) for c in entry.get("cidrs", [])):
            return str(entry["netns"])
    return None


async def _open(netns: str | None, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if netns is None:
        return await asyncio.open_connection(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = in_netns(netns, lambda: socket.socket(family, socket.SOCK_STREAM))
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except OSError:
        sock.close()
        raise
    return await asyncio.open_connection(sock=sock)


async def _refuse(writer: asyncio.StreamWriter, status: str, why: str) -> None:
    body = why.encode()
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    )
    with contextlib.suppress(ConnectionError):
        await writer.drain()
    writer.close()


def handler(routes: Path):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readline()).decode("latin-1").split()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass  # headers: nothing in them matters here
        if len(request) != 3 or request[0] != "CONNECT":
            await _refuse(writer, "405 Method Not Allowed", "only CONNECT host:port")
            return
        host, port = split_address(request[1])
        try:
            up_reader, up_writer = await _open(netns_for(routes, host), host, port)
        except OSError as err:
            await _refuse(writer, "502 Bad Gateway", f"{request[1]}: {err}")
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return handle


async def serve(listen: Path, routes: Path) -> None:
    listen.unlink(missing_ok=True)
    server = await asyncio.start_unix_server(handler(routes), path=str(listen))
    listen.chmod(0o600)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    listen, routes = argv
    print(f"egress: CONNECT proxy on {listen}, routes in {routes} (pid {os.getpid()})", flush=True)
    asyncio.run(serve(Path(listen), Path(routes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
