"""sim/plane/processes.py's free_port: a listening port below the kernel's ephemeral range, never
one something already listens on (a component that could not bind its port failed a test run)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from gpu_operator.sim.plane.processes import LISTEN_PORTS, ControlPlaneError, free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_free() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert port in LISTEN_PORTS and port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_something_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            spare = probe.getsockname()[1]
        choices = iter([taken, taken, spare])
        monkeypatch.setattr(random, "choice", lambda _ports: next(choices))
        assert free_port() == spare


def test_no_free_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setattr(random, "choice", lambda _ports: held.getsockname()[1])
        with pytest.raises(ControlPlaneError, match="no free port in 20000-32767"):
            free_port()
