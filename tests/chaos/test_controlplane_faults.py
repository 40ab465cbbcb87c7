"""The control plane fails under a running operator: the apiserver (then etcd) is SIGKILLed and
restarted. The operator process keeps running (same PID), its /readyz reports the outage, its
watches resume, and a node that joins right as the apiserver returns is labelled within 10 s."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.chaos import HEAVY, readyz, rollout
from tests.support.faultproxy import FaultProxy
from tests.support.status import reconciled
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
OUTAGE_SECONDS = 20  # long enough for an uncapped retry backoff to reach 8-16 s (it did: see docs)
RECOVERY_LIMIT = 10.0


def labelled(kube: Client, node: str) -> bool:
    return (kube.get(Node, node).metadata.labels or {}).get(DEPLOY_DRIVER) == "true"


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_operator_rides_out_a_killed_control_plane_component(
    component: str,
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    record_property: Callable[[str, object], None],
) -> None:
    fake_nodes("dgx-h100:3")
    operator = start_operator()
    cluster_policies({})
    reconciled(kube, context=operator.log_text)
    wait_for("operator /readyz 200", lambda: readyz(operator), until=lambda c: c == 200, timeout=30)
    assert operator.process is not None
    pid = operator.process.pid

    control_plane.kill(component)
    try:
        outage_start = time.monotonic()
        wait_for(
            f"operator /readyz 503 while {component} is down",
            lambda: readyz(operator),
            until=lambda c: c == 503,
            timeout=OUTAGE_SECONDS,
            context=operator.log_text,
        )
        seen_down = time.monotonic() - outage_start
        time.sleep(max(0.0, OUTAGE_SECONDS - seen_down))  # the outage itself lasts OUTAGE_SECONDS
        assert operator.alive, operator.log_text()[-3000:]
    finally:
        control_plane.revive(component)  # also after a failure: the module's later tests need it
    # "Back" is when the apiserver is ready again (after etcd, that is its storage's return too)
    # and its watch caches have caught up with etcd (revive waits for both): a node that joins
    # before kwok's Lease watch resumes keeps its pods Pending for good (ControlPlane._caches_fresh).
    wait_for("the apiserver's /readyz", control_plane.apiserver_ready, timeout=60, interval=0.1)
    back = time.monotonic()
    late = fake_nodes("dgx-h100:1", wait=False)[0]  # joins the moment the apiserver is back
    wait_for(
        f"node {late} labelled after {component} returned",
        lambda: labelled(kube, late),
        timeout=60,
        interval=0.2,
        context=operator.log_text,
    )
    recovery = time.monotonic() - back
    wait_for(
        "operator /readyz 200 again",
        lambda: readyz(operator),
        until=lambda c: c == 200,
        timeout=30,
        context=operator.log_text,
    )
    record_property(f"{component}_recovery_seconds", round(recovery, 1))
    print(
        f"{component}: /readyz 503 after {seen_down:.1f} s of outage; new node labelled "
        f"{recovery:.1f} s after it returned"
    )
    assert operator.alive and operator.process.pid == pid, "the operator must survive, not be restarted"
    assert recovery <= RECOVERY_LIMIT, f"labelled {recovery:.1f} s after {component} returned"
    reconciled(kube, context=lambda: f"{rollout(kube, operator.namespace)}\n{operator.log_text()[-3000:]}")


def test_slow_lossy_apiserver_still_converges(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    tmp_path: Path,
) -> None:
    """The operator talks to the apiserver through a proxy that delays every chunk and drops a
    share of new connections: it still reaches Reconciled and labels every node."""
    count, latency, drops = (100, 0.1, 0.2) if HEAVY else (8, 0.05, 0.1)
    names = fake_nodes(f"dgx-h100:{count}")
    port = int(control_plane.server.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port, latency=latency, drop_fraction=drops) as proxy:
        config = proxy.kubeconfig(control_plane.kubeconfig_for("operator"), tmp_path / "via-proxy.kubeconfig")
        operator = start_operator(kubeconfig=config)
        cluster_policies({})
        reconciled(kube, timeout=240, context=operator.log_text)
        for name in names:
            assert labelled(kube, name), name
        assert proxy.dropped > 0, "the proxy must have dropped connections, or this tests nothing"
        print(
            f"converged through {latency * 1000:.0f} ms per chunk and {proxy.dropped}/{proxy.accepted} "
            "connections dropped"
        )


def test_node_that_joins_during_a_partition_is_labelled_when_it_heals(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The operator alone is cut off from the apiserver (the cluster goes on): a node joins while
    it cannot see it, and is labelled within 10 s of the line coming back."""
    fake_nodes("dgx-h100:2")
    port = int(control_plane.server.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as proxy:
        config = proxy.kubeconfig(control_plane.kubeconfig_for("operator"), tmp_path / "via-proxy.kubeconfig")
        operator = start_operator(kubeconfig=config)
        cluster_policies({})
        reconciled(kube, context=operator.log_text)
        assert operator.process is not None
        pid = operator.process.pid
        proxy.partition(True)
        wait_for(
            "operator /readyz 503 during the partition",
            lambda: readyz(operator),
            until=lambda c: c == 503,
            timeout=30,
            context=operator.log_text,
        )
        late = fake_nodes("dgx-h100:1", wait=False)[0]
        time.sleep(OUTAGE_SECONDS)  # the partition itself: the operator's retries back off meanwhile
        assert not labelled(kube, late)
        proxy.partition(False)
        healed = time.monotonic()
        wait_for(
            f"node {late} labelled after the partition healed",
            lambda: labelled(kube, late),
            timeout=60,
            interval=0.2,
            context=operator.log_text,
        )
        recovery = time.monotonic() - healed
        record_property("partition_recovery_seconds", round(recovery, 1))
        print(f"partition: node that joined meanwhile labelled {recovery:.1f} s after it healed")
        assert operator.alive and operator.process.pid == pid
        assert recovery <= RECOVERY_LIMIT, f"labelled {recovery:.1f} s after the partition healed"
        wait_for("operator /readyz 200 again", lambda: readyz(operator), until=lambda c: c == 200, timeout=30)
