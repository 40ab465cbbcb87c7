"""A local TCP port for a test's server: bound on 127.0.0.1 by the kernel's choice, then closed."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (another process may take it before the test does; the
    kernel hands out ports in rising order, so that is rare)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
