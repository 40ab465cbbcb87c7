"""A TCP forwarder across network namespaces: listens on HOST:PORT inside the network namespace
given by a /proc/<pid>/ns/net path and forwards every connection to HOST:PORT in the namespace
it was started in (the real node reaches the apiserver on the machine's 127.0.0.1 this way).

    python -m gpu_operator.sim.nsproxy /proc/1234/ns/net 10.0.0.1:443 127.0.0.1:6443
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening socket created inside `netns` (a socket stays in the namespace it was made in);
    the calling thread returns to its own namespace afterwards."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.create_server((host, port), backlog=128, reuse_port=False)
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        await server.serve_forever()


def _split(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    netns, listen, target = argv
    sock = listen_in(netns, *_split(listen))
    print(f"nsproxy: {netns} {listen} -> {target}", flush=True)
    asyncio.run(serve(sock, *_split(target)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
