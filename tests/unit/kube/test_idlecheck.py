"""The pool's idle check (kube/idlecheck.py): the same answer as the HTTP client's own check,
with the connection's socket looked up once, not on every check."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpcore2
import pytest
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import Cluster, Context, User

from gpu_operator.kube.client import _transport
from gpu_operator.kube.idlecheck import IdleCheckBackend, IdleCheckStream


class Inner(httpcore2.AsyncNetworkStream):
    """A connection's stream over one end of a socket pair; counts how often its socket is asked for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.asked: dict[str, int] = {}

    def get_extra_info(self, info: str) -> Any:
        self.asked[info] = self.asked.get(info, 0) + 1
        return self.sock if info == "socket" else None


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, server = socket.socketpair()
    yield ours, server
    ours.close()
    server.close()


def test_the_socket_is_looked_up_once_for_many_checks(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _server = pair
    inner = Inner(ours)
    stream = IdleCheckStream(inner)
    answers = [stream.get_extra_info("is_readable") for _ in range(100)]
    assert answers == [False] * 100  # an idle connection: nothing to read
    assert inner.asked == {"socket": 1}


def test_a_connection_the_server_closed_reads_as_readable(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, server = pair
    stream = IdleCheckStream(Inner(ours))
    assert stream.get_extra_info("is_readable") is False
    server.close()
    assert stream.get_extra_info("is_readable") is True
    ours.close()  # no socket any more: readable, as the pool's own check has it
    assert stream.get_extra_info("is_readable") is True


def test_other_facts_come_from_the_connections_stream(pair: tuple[socket.socket, socket.socket]) -> None:
    inner = Inner(pair[0])
    assert IdleCheckStream(inner).get_extra_info("ssl_object") is None
    assert inner.asked == {"ssl_object": 1}


def test_the_operators_pool_uses_the_idle_check() -> None:
    config = SingleConfig(
        context_name="c",
        context=Context(cluster="c", user="u"),
        cluster=Cluster(server="https://127.0.0.1:6443"),
        user=User(token="t"),
    )
    transport: Any = _transport(config, lambda: None)
    assert isinstance(transport.inner._pool._network_backend, IdleCheckBackend)
