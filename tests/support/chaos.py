"""Shared pieces of the chaos tests (tests/chaos): the heavy switch, the operator's /readyz,
the operator process's RSS, and reading the apiserver's audit log for one user's writes."""

from __future__ import annotations

import datetime as dt
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.operator_process import OperatorProcess

HEAVY_ENV = "GPU_OPERATOR_CHAOS_HEAVY"
HEAVY = os.environ.get(HEAVY_ENV, "") not in ("", "0")
"""GPU_OPERATOR_CHAOS_HEAVY=1: the benchmark-machine variants (more nodes, more crash points)."""

OPERATOR_USER = "gpu-operator-sim"  # the sim PKI's user for the operator's kubeconfig


def readyz(operator: OperatorProcess) -> int:
    """The HTTP status of the operator's /readyz (0 while it does not answer at all)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/readyz", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/status (VmRSS, in kB there)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


def epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def writes_by(control_plane: ControlPlane, user: str = OPERATOR_USER, *,
              since: float = 0.0) -> Iterator[dict[str, Any]]:
    """Audit events (ResponseComplete) of `user`'s write requests received at or after `since`."""
    for event in control_plane.audit_events():
        if event.get("user", {}).get("username") != user or event.get("stage") != "ResponseComplete":
            continue
        if epoch(event.get("requestReceivedTimestamp", "1970-01-01T00:00:00Z")) >= since:
            yield event
