"""Shared pieces of the chaos tests (tests/chaos): the heavy switch, the operator's /readyz,
the operator process's RSS, and reading the apiserver's audit log for one user's writes."""

from __future__ import annotations

import datetime as dt
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from gpu_operator.sim.plane.auditlog import AuditReader
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess

HEAVY_ENV = "GPU_OPERATOR_CHAOS_HEAVY"
HEAVY = os.environ.get(HEAVY_ENV, "") not in ("", "0")
"""GPU_OPERATOR_CHAOS_HEAVY=1: the benchmark-machine variants (more nodes, more crash points)."""

READ_VERBS = ("get", "list", "watch")  # the audit log keeps ServiceAccounts' reads too
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


def writes_by(
    control_plane: ControlPlane, user: str = OPERATOR_USER, *, since: float = 0.0
) -> Iterator[dict[str, Any]]:
    """Audit events (ResponseComplete) of `user`'s write requests received at or after `since`."""
    for event in control_plane.audit_events():
        if event.get("user", {}).get("username") != user or event.get("stage") != "ResponseComplete":
            continue
        if epoch(event.get("requestReceivedTimestamp", "1970-01-01T00:00:00Z")) >= since:
            yield event


class AuditTail:
    """Reads the audit log incrementally: `new()` returns the write events (ResponseComplete) of
    `user` appended since the last call, so a test can react to the Nth write within ~20 ms."""

    def __init__(self, control_plane: ControlPlane, user: str = OPERATOR_USER) -> None:
        # only what happens from now on, across the apiserver's rotations of the log
        self.reader, self.user = AuditReader.from_now(control_plane.audit_log), user

    def new(self) -> list[dict[str, Any]]:
        events = []
        for line in self.reader.read():
            event = json.loads(line)
            if (
                event.get("user", {}).get("username") == self.user
                and event.get("stage") == "ResponseComplete"
                and event.get("verb") not in READ_VERBS
            ):
                events.append(event)
        return events


def category(event: dict[str, Any]) -> str:
    """What a write of the operator was, for crash points: label (a Node patch), status (the
    ClusterPolicy's status), pod (a pod deletion or eviction: upgrades), event, or apply."""
    ref = event.get("objectRef", {})
    resource, sub = ref.get("resource"), ref.get("subresource", "")
    if resource == "nodes":
        return "label"
    if resource == "clusterpolicies" and sub == "status":
        return "status"
    if resource == "pods":
        return "pod"
    if resource == "events":
        return "event"
    return "apply"


def rollout(kube: Any, namespace: str) -> str:
    """The operands' DaemonSets (desired/ready/updated) and pods that are not Ready, one per
    line: context for a wait on Reconciled that may time out on the cluster's side."""
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.resources.core_v1 import Pod

    lines = []
    for ds in kube.list(DaemonSet, namespace=namespace):
        s = ds.status
        lines.append(
            f"DaemonSet {ds.metadata.name}: desired {s.desiredNumberScheduled if s else '?'} "
            f"ready {s.numberReady if s else '?'} updated {s.updatedNumberScheduled if s else '?'} "
            f"observedGeneration {s.observedGeneration if s else '?'}/{ds.metadata.generation}"
        )
    for pod in kube.list(Pod, namespace=namespace):
        conditions = {c.type: c.status for c in (pod.status.conditions or [])} if pod.status else {}
        if conditions.get("Ready") != "True":
            lines.append(
                f"Pod {pod.metadata.name} on {pod.spec.nodeName if pod.spec else '?'}: "
                f"{pod.status.phase if pod.status else '?'} {conditions}"
            )
    return "\n".join(lines)
