"""A TCP proxy in front of the apiserver that adds latency, drops a fraction of new connections
and can cut the line altogether (a network partition between the operator and the apiserver).

TLS passes through untouched (the client still verifies the apiserver's certificate, whose SANs
name 127.0.0.1), so the operator under test runs unchanged with a kubeconfig that points here.
The proxy runs its own asyncio loop in a daemon thread; use it as a context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    latency: float = 0.0
    """Seconds added before each chunk is passed on, in both directions."""
    drop_fraction: float = 0.0
    """Share of new connections closed at once, before a byte is passed."""
    seed: int = 17
    port: int = 0
    accepted: int = 0
    dropped: int = 0
    _partitioned: bool = False
    _rng: random.Random = field(init=False)
    _loop: asyncio.AbstractEventLoop = field(init=False)
    _thread: threading.Thread = field(init=False)
    _server: asyncio.Server | None = None
    _live: set[asyncio.StreamWriter] = field(default_factory=set)

    def __enter__(self) -> FaultProxy:
        self._rng = random.Random(self.seed)
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", self.port)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the fault proxy did not start listening within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._live):
                writer.close()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def address(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def partition(self, on: bool) -> None:
        """Cut every open connection and refuse new ones (on), or let them through again (off)."""

        def apply() -> None:
            self._partitioned = on
            if on:
                for writer in list(self._live):
                    writer.transport.abort()

        self._loop.call_soon_threadsafe(apply)

    def kubeconfig(self, original: Path, target: Path) -> Path:
        """A copy of `original` whose cluster server is this proxy."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.address
        target.write_text(yaml.safe_dump(config))
        return target

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._partitioned or self._rng.random() < self.drop_fraction:
            self.dropped += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._live |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._live.discard(w)
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()
        writer.transport.abort()  # one side ended: end the other too, as a real middlebox would
