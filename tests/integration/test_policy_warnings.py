"""A ClusterPolicy field set in a way that has no effect is reported, not silently ignored: the
operator sends a Warning Event on the ClusterPolicy once per generation (real control plane)."""

from __future__ import annotations

from collections.abc import Callable

from lightkube import Client
from lightkube.resources.core_v1 import Event

from gpu_operator.sim.operator_process import OperatorProcess
from gpu_operator.vocabulary import POLICY_WARNING_REASON
from tests.support.status import reconciled
from tests.support.waiting import wait_for


def policy_warnings(kube: Client, name: str) -> list[str]:
    return [e.message or "" for e in kube.list(Event, namespace="default",
                                               fields={"involvedObject.kind": "ClusterPolicy",
                                                       "involvedObject.name": name})
            if e.reason == POLICY_WARNING_REASON]


def test_a_driver_version_without_repository_and_image_is_reported(
        kube: Client, fake_nodes: Callable[..., list[str]], start_operator: Callable[..., OperatorProcess],
        cluster_policies: Callable[..., str]) -> None:
    fake_nodes("dgx-h100:1")
    operator = start_operator()
    name = cluster_policies({"driver": {"version": "580.95.05"}})
    reconciled(kube, name, context=operator.log_text)
    found = wait_for("the PolicyWarning Event", lambda: policy_warnings(kube, name), timeout=60,
                     context=operator.log_text)
    assert len(found) == 1 and "driver.repository and driver.image" in found[0], found
    assert "580.95.05" in found[0]
    # later reconciles of the same generation do not repeat it
    reconciled(kube, name, context=operator.log_text)
    assert len(policy_warnings(kube, name)) == 1
