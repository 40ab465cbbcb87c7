"""A stand-in apiserver for unit tests of the commands that talk to a cluster: plain HTTP on
127.0.0.1, fixed answers by path, and kubeconfigs that point at it or at a closed port."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

# path (no query) -> (HTTP status, JSON body); None: close the connection without an answer
Answer = tuple[int, Any] | None
Route = Callable[[str], Answer]


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for `server` (context `c`, a token user; TLS not verified)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    return path


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    return free_port()


def status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


@contextmanager
def serve(route: Route) -> Iterator[str]:
    """Serve `route` on 127.0.0.1 until the block ends; yields the server URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            answer = route(self.path.split("?", 1)[0])
            if answer is None:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            code, body = answer
            data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
            self.send_response(code)
            self.send_header(
                "Content-Type", "application/json" if not isinstance(body, str) else "text/plain"
            )
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _answer  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
