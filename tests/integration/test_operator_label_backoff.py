"""A node label patch the apiserver keeps refusing (403 from a ValidatingAdmissionPolicy) backs off
on that node alone: no full reconcile every second, one warning, every failure counted."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import cast

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.waiting import wait_for

POLICY = "gpu-operator-test-deny-node-labels"


def _metric(operator: OperatorProcess, name: str, labels: str = "") -> float:
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
    )
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def deny_label_changes(kube: Client) -> Iterator[Callable[[str], None]]:
    """Make the apiserver refuse (403) every change of one node's labels."""

    def deny(node: str) -> None:
        kube.create(
            cast(
                ValidatingAdmissionPolicy,
                ValidatingAdmissionPolicy.from_dict(
                    {
                        "metadata": {"name": POLICY},
                        "spec": {
                            "failurePolicy": "Fail",
                            "matchConstraints": {
                                "resourceRules": [
                                    {
                                        "apiGroups": [""],
                                        "apiVersions": ["v1"],
                                        "operations": ["UPDATE"],
                                        "resources": ["nodes"],
                                    }
                                ]
                            },
                            "validations": [
                                {
                                    "expression": f"object.metadata.name != '{node}' || "
                                    "object.metadata.labels == oldObject.metadata.labels",
                                    "reason": "Forbidden",  # 403 (a policy's default is 422 Invalid)
                                    "message": "labels of this node are frozen by a test policy",
                                }
                            ],
                        },
                    }
                ),
            )
        )
        kube.create(
            cast(
                ValidatingAdmissionPolicyBinding,
                ValidatingAdmissionPolicyBinding.from_dict(
                    {
                        "metadata": {"name": POLICY},
                        "spec": {"policyName": POLICY, "validationActions": ["Deny"]},
                    }
                ),
            )
        )

        def refused() -> bool:  # the policy takes effect once the apiserver has loaded it
            for value in ("x", None):  # set a probe label, take it off again
                try:
                    kube.patch(
                        Node,
                        node,
                        {"metadata": {"labels": {"probe.test/frozen": value}}},
                        patch_type=PatchType.MERGE,
                    )
                except ApiError as err:
                    # refused: the policy is in force (it may load between the two patches, and
                    # the probe label then stays on the node: the test reads no label of it)
                    if err.status.code == 403:
                        return True
                    raise
            return False

        wait_for(
            "the admission policy to refuse label changes",
            refused,
            timeout=60,
            context=lambda: repr(kube.get(ValidatingAdmissionPolicy, POLICY).status),
        )

    yield deny
    for kind in (ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicy):
        try:
            kube.delete(kind, POLICY)
        except ApiError as err:
            if err.status.code != 404:
                raise


def test_a_refused_label_patch_backs_off_without_driving_reconciles(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    deny_label_changes: Callable[[str], None],
) -> None:
    good, frozen = fake_nodes("dgx-h100:2")
    deny_label_changes(frozen)
    operator = start_operator()
    cluster_policies({})
    wait_for(
        "the other node to be labelled",
        lambda: kube.get(Node, good).metadata.labels.get("nvidia.com/gpu.present") == "true",
        context=operator.log_text,
    )
    failures = 'gpu_operator_node_label_patch_failures_total{code="403"}'
    wait_for(
        "a refused patch to be counted",
        lambda: _metric(operator, failures) >= 2,
        timeout=30,
        context=operator.log_text,
    )

    window = 16.0
    reconciles0, failures0 = (
        _metric(operator, "gpu_operator_reconciliation_total"),
        _metric(operator, failures),
    )
    time.sleep(window)  # a measurement window: what happens in it is the subject of the test
    reconciles = _metric(operator, "gpu_operator_reconciliation_total") - reconciles0
    refused = _metric(operator, failures) - failures0

    # Retried every second, as before, this would be ~16 of each. With backoff (1, 2, 4, 8, 16 s)
    # at most a few retries fall into the window; the policy requeues itself every 5 s while the
    # frozen node keeps it notReady, which is the only other source of reconciles.
    assert 1 <= refused <= 5, f"{refused} refused patches in {window} s"
    assert reconciles <= 7, f"{reconciles} reconciles in {window} s"
    log = operator.log_text()
    assert log.count(f"node {frozen}: label patch failed") == 1, log
    assert "HTTP 403" in log and kube.get(Node, frozen).metadata.labels.get("nvidia.com/gpu.present") is None
