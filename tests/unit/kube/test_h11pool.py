"""kube/h11pool.py against real servers on 127.0.0.1: plain HTTP, and once TLS with the simulator's
PKI through kube/client.py's transport (which wraps the pool in the leader fence)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import KubeConfig

from gpu_operator.kube.client import FencedTransport, NotLeading, _transport
from gpu_operator.kube.h11pool import H11Pool
from gpu_operator.sim.plane import pki as simpki
from tests.support.ports import free_port
from tests.unit.kube.tlskit import admin_kubeconfig, server_tls


@dataclass
class Seen:
    conn: int  # which connection the server accepted it on (1, 2, ...)
    nth: int  # which request on that connection (1, 2, ...)
    method: str
    path: str
    body: bytes


# What the server writes for a request (or a coroutine's result): an answer's bytes; None closes the
# connection without answering; b"" never answers (the server waits for the client to close it).
Answer = Callable[[Seen], bytes | None | Awaitable[bytes | None]]


def response(body: bytes = b"{}") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def chunked(pieces: list[bytes]) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


def echo(seen: Seen) -> bytes:
    return response(seen.body or b"{}")


def by_path(replies: dict[str, bytes | None]) -> Answer:
    """`replies` by request path; the other requests get their own body back."""
    return lambda seen: replies[seen.path] if seen.path in replies else echo(seen)


class Server:
    """Reads each request whole (head, Content-Length body), records it and writes `answer`'s
    bytes; closes a connection after `keep` answers when given. Counts connections accepted, open
    and the most open at once, and whether each presented a client certificate."""

    def __init__(self, answer: Answer, keep: int | None = None) -> None:
        self.answer, self.keep = answer, keep
        self.seen: list[Seen] = []
        self.accepted = self.open = self.peak = 0
        self.client_certs: list[bool] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn, self.open = self.accepted, self.open + 1
        self.peak = max(self.peak, self.open)
        self.client_certs.append(writer.get_extra_info("peercert") is not None)
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                for nth in itertools.count(1):
                    lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                    fields = dict(line.lower().split(":", 1) for line in lines[1:] if line)
                    body = await reader.readexactly(int(fields.get("content-length", "0")))
                    method, path, _ = lines[0].split(" ")
                    seen = Seen(conn, nth, method, path, body)
                    self.seen.append(seen)
                    reply = self.answer(seen)
                    if not isinstance(reply, bytes | None):
                        reply = await reply
                    if reply == b"":
                        await reader.read()
                    if not reply:
                        break
                    writer.write(reply)
                    await writer.drain()
                    if nth == self.keep:
                        break
        finally:
            self.open -= 1
            writer.close()

    def where(self) -> list[str]:
        """Each request seen, as "<connection> <method> <path>"."""
        return [f"{s.conn} {s.method} {s.path}" for s in self.seen]


@contextlib.asynccontextmanager
async def serving(server: Server, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=tls)
    async with listening:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{listening.sockets[0].getsockname()[1]}"


@contextlib.asynccontextmanager
async def exchange(
    answer: Answer = echo, *, keep: int | None = None, fence: Callable[[], bool] | None = None, **pool: Any
) -> AsyncIterator[tuple[Server, H11Pool, httpx2.AsyncClient]]:
    """A plain HTTP server answering with `answer`; a client through an H11Pool (options `pool`)
    to it, behind a FencedTransport with `fence` when given."""
    server = Server(answer, keep)
    async with asyncio.timeout(5), serving(server) as url:  # a hang fails the test, in 5 s
        h11pool = H11Pool(url, None, **pool)
        transport = h11pool if fence is None else FencedTransport(h11pool, lambda: fence)
        async with httpx2.AsyncClient(transport=transport, base_url=url) as client:
            yield server, h11pool, client


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(2):
        while not check():
            await asyncio.sleep(0.001)


def test_sequential_requests_share_one_connection_and_bodies_arrive_whole() -> None:
    """Five requests one after another go over one connection; a Content-Length body larger than
    one read, a body of several chunks, and a POST's and a large PATCH's bodies arrive whole."""
    big, patch = bytes(range(256)) * 400, b"p" * 300_000
    answer = by_path({"/big": response(big), "/chunks": chunked([b"alpha-", b"beta-", b"gamma"])})

    async def main() -> None:
        async with exchange(answer) as (server, _, client):
            assert (await client.get("/big")).content == big
            assert (await client.get("/chunks")).content == b"alpha-beta-gamma"
            assert (await client.post("/post", content=b'{"a": 1}')).content == b'{"a": 1}'
            assert (await client.patch("/patch", content=patch)).content == patch
            assert (await client.get("/last")).status_code == 200
        assert server.accepted == 1 and [s.conn for s in server.seen] == [1] * 5
        assert [s.body for s in server.seen if s.method != "GET"] == [b'{"a": 1}', patch]

    asyncio.run(main())


def test_at_most_max_connections_are_open_at_once() -> None:
    """Six concurrent requests with max_connections=2: the server never has more than two
    connections open, and all six are answered over those two."""

    async def slow(seen: Seen) -> bytes:
        await asyncio.sleep(0.03)
        return response()

    async def main() -> None:
        async with exchange(slow, max_connections=2) as (server, pool, client):
            answers = await asyncio.gather(*(client.get(f"/{i}") for i in range(6)))
            assert [a.status_code for a in answers] == [200] * 6 and pool.open == 2
        assert server.peak == 2 and server.accepted == 2 and len(server.seen) == 6

    asyncio.run(main())


def test_a_request_waiting_past_the_pool_timeout_fails_with_pool_timeout() -> None:
    """With the one connection busy, a second request fails with PoolTimeout after its pool
    timeout without reaching the server; the first is answered and the pool serves the next."""

    async def main() -> None:
        release = asyncio.Event()

        async def held(seen: Seen) -> bytes:
            await release.wait()
            return response()

        async with exchange(held, max_connections=1) as (server, _, client):
            first = asyncio.create_task(client.get("/held"))
            await until(lambda: len(server.seen) == 1)
            with pytest.raises(httpx2.PoolTimeout):
                await client.get("/waits", timeout=httpx2.Timeout(5, pool=0.2))
            release.set()
            assert (await first).status_code == 200
            assert (await client.get("/next")).status_code == 200
        assert server.where() == ["1 GET /held", "1 GET /next"]

    asyncio.run(main())


def test_a_read_timeout_raises_and_the_connection_is_not_reused() -> None:
    """A server that never answers: ReadTimeout after the read timeout, and the next request goes
    over a new connection."""

    async def main() -> None:
        async with exchange(by_path({"/silent": b""})) as (server, _, client):
            with pytest.raises(httpx2.ReadTimeout):
                await client.get("/silent", timeout=httpx2.Timeout(5, read=0.2))
            assert (await client.get("/next")).status_code == 200
        assert server.where() == ["1 GET /silent", "2 GET /next"]

    asyncio.run(main())


def test_an_idle_connection_the_server_closed_is_not_used_again() -> None:
    """The server closes each connection after its first answer: once the pool has seen the close,
    the next GET goes over a new connection; a GET sent at once, before or as the close arrives,
    is answered on a new connection too."""

    async def main() -> None:
        async with exchange(keep=1) as (server, pool, client):
            assert (await client.get("/1")).status_code == 200
            await until(lambda: len(pool.idle) == 1 and pool.idle[0].closed)
            assert (await client.get("/2")).status_code == 200
            assert (await client.get("/3")).status_code == 200
        assert server.where() == ["1 GET /1", "2 GET /2", "3 GET /3"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("method", "warm", "dropped_on", "answered", "seen"),
    [
        ("GET", True, {1}, True, ["1 GET /warm", "1 GET /x", "2 GET /x"]),  # sent again, answered
        ("GET", True, {1, 2}, False, ["1 GET /warm", "1 GET /x", "2 GET /x"]),  # sent again only once
        ("GET", False, {1}, False, ["1 GET /x"]),  # dropped on a new connection: not sent again
        ("POST", True, {1}, False, ["1 GET /warm", "1 POST /x"]),  # a write: never sent again
    ],
)
def test_a_request_the_server_drops_unanswered(
    method: str, warm: bool, dropped_on: set[int], answered: bool, seen: list[str]
) -> None:
    """The server reads /x and closes the connection without answering: a GET on a reused
    connection is sent once more on a new one; a GET on a new connection, and a POST (it may have
    been applied), fail with RemoteProtocolError; the server saw exactly the copies listed."""

    def answer(request: Seen) -> bytes | None:
        return None if request.path == "/x" and request.conn in dropped_on else response()

    async def main() -> None:
        async with exchange(answer) as (server, _, client):
            if warm:
                await client.get("/warm")
            sent = client.request(method, "/x", content=b"{}" if method == "POST" else None)
            if answered:
                assert (await sent).status_code == 200
            else:
                with pytest.raises(httpx2.RemoteProtocolError):
                    await sent
        assert server.where() == seen

    asyncio.run(main())


def test_a_body_left_unread_closes_its_connection_and_a_read_one_returns_it() -> None:
    """A streamed answer closed after its first piece closes the connection (the next request opens
    another); one read to its end leaves the connection to the next request."""
    big = b"x" * 500_000

    async def main() -> None:
        async with exchange(by_path({"/big": response(big)})) as (server, pool, client):
            async with client.stream("GET", "/big") as partly:
                async for _ in partly.aiter_raw():
                    break
            assert (await client.get("/after")).status_code == 200
            async with client.stream("GET", "/big") as whole:
                assert await whole.aread() == big
            assert (await client.get("/last")).status_code == 200
            assert pool.open == 1
        assert server.where() == ["1 GET /big", "2 GET /after", "2 GET /big", "2 GET /last"]

    asyncio.run(main())


def test_a_refused_connection_raises_connect_error_and_frees_its_slot() -> None:
    """Nothing listens: ConnectError, twice with max_connections=1 (a failed connect gives its
    slot back instead of leaving the next request to wait for it)."""

    async def main() -> None:
        url = f"http://127.0.0.1:{free_port()}"
        pool = H11Pool(url, None, max_connections=1)
        async with httpx2.AsyncClient(transport=pool, base_url=url) as client:
            for _ in range(2):
                with pytest.raises(httpx2.ConnectError):
                    await client.get("/", timeout=httpx2.Timeout(5, pool=0.2))
        assert pool.open == 0

    asyncio.run(main())


def test_the_trace_event_comes_before_the_request_and_can_stop_it() -> None:
    """`http11.send_request_headers.started` is reported for each request, and raising from it (as
    FencedTransport does when the leader fence closed after a write entered) stops the request once
    it holds a connection: the server reads nothing more on that connection."""

    class Stop(Exception):
        pass

    events: list[str] = []
    checks = 0

    async def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)
        if info["request"].url.path == "/stopped":
            raise Stop

    def fence() -> bool:
        nonlocal checks
        checks += 1
        return checks == 1  # open when the write enters, closed at the last moment

    async def main() -> None:
        async with exchange() as (server, _, client):
            assert (await client.get("/sent", extensions={"trace": trace})).status_code == 200
            assert events == ["http11.send_request_headers.started"]
            with pytest.raises(Stop):
                await client.post("/stopped", content=b"{}", extensions={"trace": trace})
            await until(lambda: server.open == 0)
        assert server.accepted == 1 and server.where() == ["1 GET /sent"]
        async with exchange(fence=fence) as (server, _, client):
            with pytest.raises(NotLeading):
                await client.post("/api/v1/namespaces/x/configmaps", content=b"{}")
            await until(lambda: server.open == 0)
        assert checks == 2 and server.accepted == 1 and server.seen == []

    asyncio.run(main())


def test_an_idle_connection_past_keepalive_expiry_is_not_reused() -> None:
    """keepalive_expiry=0.1: after 0.2 s idle, the next request opens a new connection (the first
    test shows one reused within the default expiry)."""

    async def main() -> None:
        async with exchange(keepalive_expiry=0.1) as (server, _, client):
            await client.get("/1")
            await asyncio.sleep(0.2)
            await client.get("/2")
        assert server.where() == ["1 GET /1", "2 GET /2"]

    asyncio.run(main())


def test_the_operators_transport_over_tls_with_a_kubeconfig(pki: simpki.Pki, tmp_path: Path) -> None:
    """kube/client.py's transport is an H11Pool behind the fence: over TLS with the kubeconfig's
    CA and client certificate, a GET, a POST and a GET share one connection, bodies intact."""

    async def main() -> None:
        tls = server_tls(pki)
        server = Server(echo)
        async with serving(server, tls) as url:
            path = admin_kubeconfig(pki, tmp_path / "kubeconfig", url)
            config = KubeConfig.from_file(path).get()
            assert config is not None
            transport = _transport(config, lambda: None)
            assert isinstance(transport, FencedTransport) and isinstance(transport.inner, H11Pool)
            async with httpx2.AsyncClient(transport=transport, base_url=url) as client:
                assert (await client.get("/version")).content == b"{}"
                assert (await client.post("/api/v1/namespaces", content=b'{"n": 1}')).content == b'{"n": 1}'
                assert (await client.get("/api")).status_code == 200
        assert server.accepted == 1 and server.client_certs == [True]
        assert server.where() == ["1 GET /version", "1 POST /api/v1/namespaces", "1 GET /api"]

    asyncio.run(main())
