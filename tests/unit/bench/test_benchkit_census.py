"""bench/benchkit.py: the census of operand pods that are not Ready (what a stalled rollout says)
and the simulator's feature gates as `scale.py --feature-gates` takes them."""

from __future__ import annotations

import pytest
from lightkube.models.core_v1 import (
    NodeCondition,
    NodeStatus,
    PodCondition,
    PodIP,
    PodSpec,
    PodStatus,
)
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node, Pod

from tests.support.benchload import bench_module

benchkit = bench_module("benchkit")


def _pod(name: str, owner: str, node: str, phase: str, **conditions: str) -> Pod:
    return Pod(
        metadata=ObjectMeta(
            name=name,
            ownerReferences=[
                OwnerReference(apiVersion="apps/v1", kind="DaemonSet", name=owner, uid="u", controller=True)
            ],
        ),
        spec=PodSpec(containers=[], nodeName=node),
        status=PodStatus(
            phase=phase,
            conditions=[PodCondition(type=t, status=s) for t, s in conditions.items()],
            podIPs=[PodIP(ip="10.244.0.1")] if phase == "Running" else None,
        ),
    )


def _node(name: str, ready: str) -> Node:
    return Node(
        metadata=ObjectMeta(name=name),
        status=NodeStatus(conditions=[NodeCondition(type="Ready", status=ready)]),
    )


def test_the_census_counts_only_pods_not_ready_by_daemonset_status_and_node() -> None:
    pods = [
        _pod("a", "nvidia-dcgm", "n1", "Running", Ready="True", ContainersReady="True"),
        _pod("b", "nvidia-dcgm", "n2", "Running", Ready="False", ContainersReady="True"),
        _pod("c", "nvidia-dcgm", "n2", "Running", Ready="False", ContainersReady="True"),
        _pod("d", "gpu-feature-discovery", "n1", "Pending"),
    ]
    census = benchkit.unready_census(pods, [_node("n1", "True"), _node("n2", "Unknown")])
    assert census == {
        "nvidia-dcgm phase=Running ready=False containers=True ips=1 node-ready=Unknown": 2,
        "gpu-feature-discovery phase=Pending ready=- containers=- ips=0 node-ready=True": 1,
    }


def test_feature_gates_parse_and_refuse_what_is_not_a_boolean() -> None:
    assert benchkit.feature_gates("") == {}
    assert benchkit.feature_gates("StaleControllerConsistencyDaemonSet=false, A=True") == {
        "StaleControllerConsistencyDaemonSet": False,
        "A": True,
    }
    with pytest.raises(SystemExit, match="'A=1' is not NAME=true or NAME=false"):
        benchkit.feature_gates("A=1")
