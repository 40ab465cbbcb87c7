"""The control plane fails under a running operator: the apiserver (then etcd) is SIGKILLed and
restarted. The operator process keeps running (same PID), its /readyz reports the outage, its
watches resume, and a node that joins right as the apiserver returns is labelled within 10 s."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.operator_process import OperatorProcess
from tests.support.status import reconciled
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
OUTAGE_SECONDS = 20  # long enough for every client retry to back off several times
RECOVERY_LIMIT = 10.0


def readyz(operator: OperatorProcess) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.health_port}/readyz", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def labelled(kube: Client, node: str) -> bool:
    return (kube.get(Node, node).metadata.labels or {}).get(DEPLOY_DRIVER) == "true"


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_operator_rides_out_a_killed_control_plane_component(
        component: str, kube: Client, control_plane: ControlPlane, fake_nodes: Nodes,
        start_operator: Start, cluster_policies: Policies, record_property: Callable[[str, object], None]) -> None:
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
        wait_for(f"operator /readyz 503 while {component} is down", lambda: readyz(operator),
                 until=lambda c: c == 503, timeout=OUTAGE_SECONDS, context=operator.log_text)
        seen_down = time.monotonic() - outage_start
        time.sleep(max(0.0, OUTAGE_SECONDS - seen_down))  # the outage itself lasts OUTAGE_SECONDS
        assert operator.alive, operator.log_text()[-3000:]
    finally:
        control_plane.revive(component)  # also after a failure: the module's later tests need it
    # "Back" is when the apiserver is ready again (after etcd, that is its storage's return too).
    wait_for("the apiserver's /readyz", control_plane.apiserver_ready, timeout=60, interval=0.1)
    back = time.monotonic()
    late = fake_nodes("dgx-h100:1", wait=False)[0]  # joins the moment the apiserver answers again
    wait_for(f"node {late} labelled after {component} returned", lambda: labelled(kube, late),
             timeout=60, interval=0.2, context=operator.log_text)
    recovery = time.monotonic() - back
    wait_for("operator /readyz 200 again", lambda: readyz(operator), until=lambda c: c == 200, timeout=30,
             context=operator.log_text)
    record_property(f"{component}_recovery_seconds", round(recovery, 1))
    print(f"{component}: /readyz 503 after {seen_down:.1f} s of outage; new node labelled "
          f"{recovery:.1f} s after it returned")
    assert operator.alive and operator.process.pid == pid, "the operator must survive, not be restarted"
    assert recovery <= RECOVERY_LIMIT, f"labelled {recovery:.1f} s after {component} returned"
    reconciled(kube, context=operator.log_text)
