"""Leader election between two real operator processes, and the idle-write count from the real
apiserver's audit log."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.status import reconciled
from tests.support.waiting import wait_for

OPERATOR_USER = "gpu-operator-sim"


def writes_by_kind(operator: OperatorProcess) -> dict[str, float]:
    """The operator's own count of write requests, from its /metrics."""
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpu_operator_api_write_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('kind="')[1].split('"')[0]
            out[kind] = out.get(kind, 0) + float(value)
    return out


def test_only_the_leader_writes_and_a_follower_takes_over(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    fake_nodes("dgx-h100:1")
    cluster_policies({})
    args = ["--leader-lease-renew-deadline=3"]  # lease of 8 s keeps the test short
    first = start_operator(leader_elect=True, extra_args=args)
    reconciled(kube, context=first.log_text)  # the first replica leads and reconciles
    second = start_operator(leader_elect=True, extra_args=args)
    wait_for(
        "the second replica's metrics endpoint",
        lambda: _metrics_up(second),
        timeout=30,
        context=second.log_text,
    )
    # the follower retries every 2 s; two renewals by the leader give it time to try and be refused
    renewals: set[object] = set()

    def renewals_seen() -> int:
        renewals.add(kube.get(Lease, LEASE_NAME, namespace=operator_namespace).spec.renewTime)
        return len(renewals)

    wait_for(
        "two lease renewals by the leader while the follower runs",
        renewals_seen,
        until=lambda n: n >= 3,
        timeout=30,
        context=second.log_text,
    )
    lease = kube.get(Lease, LEASE_NAME, namespace=operator_namespace)
    assert lease.spec.holderIdentity and "became the leader" in first.log_text()
    assert writes_by_kind(second) == {}, "a follower must not write (not even to its Lease)"

    first.kill()  # no clean release: the follower must wait for the lease to expire
    late = fake_nodes("dgx-h100:1")[0]
    wait_for(
        "the follower to take over and label the new node",
        lambda: kube.get(Node, late).metadata.labels.get("nvidia.com/gpu.deploy.driver") == "true",
        timeout=60,
        context=second.log_text,
    )
    assert "became the leader" in second.log_text()
    new_holder = kube.get(Lease, LEASE_NAME, namespace=operator_namespace).spec.holderIdentity
    assert new_holder != lease.spec.holderIdentity


def _metrics_up(operator: OperatorProcess) -> bool:
    try:
        writes_by_kind(operator)
    except OSError:
        return False
    return True


def _operator_writes(control_plane: ControlPlane, since: float) -> list[dict[str, Any]]:
    events = []
    for event in control_plane.audit_events():
        if event.get("user", {}).get("username") != OPERATOR_USER:
            continue
        if event.get("objectRef", {}).get("resource") == "leases":
            continue
        stamp = event.get("requestReceivedTimestamp", "")
        if stamp and _epoch(stamp) >= since:
            events.append(event)
    return events


def _epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_50_nodes_reach_ready_then_no_writes_while_nothing_changes(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
) -> None:
    fake_nodes("dgx-h100:50", "cpu:2")
    operator = start_operator()
    cluster_policies({})
    reconciled(kube, context=operator.log_text)
    # the last watch events (our own status write) settle: no new write between two looks
    looks = [writes_by_kind(operator)]

    def quiet() -> bool:
        looks.append(writes_by_kind(operator))
        return looks[-1] == looks[-2]

    wait_for("the operator to stop writing", quiet, interval=1, timeout=30, context=lambda: looks[-1])
    before = looks[-1]
    start = time.time()
    assert _operator_writes(control_plane, start - 3600), "the audit log must see the operator's setup writes"
    time.sleep(60)  # the observation window itself (not synchronisation): nothing may be written in it
    writes = _operator_writes(control_plane, start)
    assert writes == [], [(w["verb"], w["objectRef"]) for w in writes]
    assert writes_by_kind(operator) == before
