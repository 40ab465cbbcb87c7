"""A TCP forwarder across network namespaces: listens on HOST:PORT inside the network namespace
given by a /proc/<pid>/ns/net path and forwards every connection to HOST:PORT in the namespace
it was started in (the real node reaches the apiserver on the machine's 127.0.0.1 this way).

    python -m gpu_operator.sim.realnode.nsproxy /proc/1234/ns/net 10.0.0.1:443 127.0.0.1:6443
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def in_netns(netns: str, make: Callable[[], T]) -> T:
    """Call `make` (which creates a socket) with this thread inside `netns`: a socket stays in the
    namespace it was made in; the thread returns to its own namespace afterwards."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            return make()
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT inside `netns`."""
    return in_netns(netns, lambda: socket.create_server((host, port), backlog=128, reuse_port=False))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(sock: socket.socket, host: str, port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        await server.serve_forever()


def split_address(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    netns, listen, target = argv
    sock = listen_in(netns, *split_address(listen))
    print(f"nsproxy: {netns} {listen} -> {target}", flush=True)
    asyncio.run(serve(sock, *split_address(target)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
