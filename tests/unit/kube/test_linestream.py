"""kube/linestream.py against a TLS server on 127.0.0.1 with the simulator's PKI: lines handed
over as they complete (split across reads, chunked), the kubeconfig's CA, client certificate and
token file used, a 401 retried once with the token file read again, a non-2xx status raised with
its body, the deadline, an encoded body refused and a caller's error ending the stream."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from lightkube import KubeConfig

from gpu_operator.kube.linestream import LineStreams, StreamStatusError
from gpu_operator.sim.plane import pki as simpki
from gpu_operator.sim.plane.kubeconfig import write_kubeconfig

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


def chunked(status: str, pieces: list[bytes], headers: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n{headers}\r\n"
    )
    return head.encode() + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def streamed(
    pki: simpki.Pki,
    tmp_path: Path,
    handler: Handler,
    *,
    token: str | None = None,
    timeout: float = 5.0,
    on_line: Callable[[bytes], None] | None = None,
) -> list[bytes]:
    """Serve `handler` over TLS (client certificates requested and checked), stream
    /api/v1/nodes?watch=true through a kubeconfig for it, return the lines received."""
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_cert))
    server_tls.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
    server_tls.verify_mode = ssl.CERT_OPTIONAL

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        peer = writer.get_extra_info("peercert")
        head += b"X-Client-Cert: %s\r\n" % (b"yes" if peer else b"no")
        try:
            await handler(head, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        server=f"https://127.0.0.1:{port}",
        ca=pki.ca_cert,
        user="u",
        client_cert=None if token else pki.client_cert("admin"),
        client_key=None if token else pki.client_key("admin"),
        token_file=Path(token) if token else None,
    )
    config = KubeConfig.from_file(path).get()
    assert config is not None
    lines: list[bytes] = []
    async with server:
        await LineStreams(config).stream(
            "/api/v1/nodes", {"watch": "true"}, on_line or lines.append, connect_timeout=5, timeout=timeout
        )
    return lines


def test_lines_split_across_reads_arrive_whole(pki: simpki.Pki, tmp_path: Path) -> None:
    seen: list[bytes] = []

    async def handler(head: bytes, writer: asyncio.StreamWriter) -> None:
        seen.append(head)
        body = b'{"type":"ADDED","n":1}\n{"type":"MODIFIED","n":2}\n\n{"type":"DELETED","n":3}'
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for at in range(0, len(body), 5):  # every piece on its own read
            piece = body[at : at + 5]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    lines = asyncio.run(streamed(pki, tmp_path, handler))
    # The empty line is skipped; the last line, without its newline, still arrives.
    assert lines == [b'{"type":"ADDED","n":1}', b'{"type":"MODIFIED","n":2}', b'{"type":"DELETED","n":3}']
    request = seen[0].decode()
    assert request.startswith("GET /api/v1/nodes?watch=true HTTP/1.1\r\n")
    assert "X-Client-Cert: yes" in request  # the kubeconfig's client certificate was presented
    assert "accept-encoding" not in request.lower()  # identity only: no compressed watch


def test_a_401_reads_the_token_file_again(pki: simpki.Pki, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old")
    seen: list[str] = []

    async def handler(head: bytes, writer: asyncio.StreamWriter) -> None:
        auth = next(line for line in head.decode().split("\r\n") if line.lower().startswith("authorization:"))
        seen.append(auth.split(":", 1)[1].strip())
        if seen[-1] == "Bearer old":
            token.write_text("new")  # the kubelet rotated it meanwhile
            writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 12\r\n\r\nUnauthorized")
        else:
            writer.write(chunked("200 OK", [b'{"ok":1}\n']))
        await writer.drain()

    assert asyncio.run(streamed(pki, tmp_path, handler, token=str(token))) == [b'{"ok":1}']
    assert seen == ["Bearer old", "Bearer new"]


def test_a_non_2xx_status_raises_with_its_body(pki: simpki.Pki, tmp_path: Path) -> None:
    async def handler(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked("410 Gone", [b'{"kind":"Status",', b'"code":410}']))
        await writer.drain()

    with pytest.raises(StreamStatusError) as err:
        asyncio.run(streamed(pki, tmp_path, handler))
    assert err.value.status == 410
    assert err.value.body == b'{"kind":"Status","code":410}'


def test_the_deadline_ends_a_silent_stream(pki: simpki.Pki, tmp_path: Path) -> None:
    async def handler(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        asyncio.run(streamed(pki, tmp_path, handler, timeout=0.5))


def test_an_encoded_body_is_refused(pki: simpki.Pki, tmp_path: Path) -> None:
    async def handler(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked("200 OK", [b"\x1f\x8b..."], headers="Content-Encoding: gzip\r\n"))
        await writer.drain()

    with pytest.raises(ValueError, match="gzip"):
        asyncio.run(streamed(pki, tmp_path, handler))


def test_the_callers_error_ends_the_stream(pki: simpki.Pki, tmp_path: Path) -> None:
    async def handler(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked("200 OK", [b'{"n":1}\n{"n":2}\n']))
        await writer.drain()
        await asyncio.sleep(5)

    got: list[bytes] = []

    def refuse_second(line: bytes) -> None:
        got.append(line)
        if len(got) == 2:
            raise RuntimeError("watch error event")

    with pytest.raises(RuntimeError, match="watch error event"):
        asyncio.run(streamed(pki, tmp_path, handler, on_line=refuse_second))
    assert got == [b'{"n":1}', b'{"n":2}']
