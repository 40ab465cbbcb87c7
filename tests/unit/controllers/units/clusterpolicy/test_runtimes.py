"""A GPU node whose runtime is not recognised: the ClusterPolicy's status names it, and the node
gets one Warning Event per message (controllers/units/clusterpolicy/runtimes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers import status as st
from gpu_operator.controllers.units.clusterpolicy import runtimes
from gpu_operator.render.facts import ClusterFacts, NodeFacts
from gpu_operator.vocabulary import GPU_PRESENT, NOT_READY, RUNTIME_NOT_RECOGNISED

POLICY = ClusterPolicy.model_validate({"metadata": {"name": "cluster-policy"}, "spec": {}})
FACTS = ClusterFacts.of(
    [
        NodeFacts("gpu-a", {GPU_PRESENT: "true"}, runtime_version="containerd://1.7.27"),
        NodeFacts("gpu-odd", {GPU_PRESENT: "true"}, runtime_version="frakti://0.3"),
    ]
)
READY = st.outcome([], True, True)


class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, str], str, str]] = []

    async def event(self, involved: dict[str, str], reason: str, message: str, **_: Any) -> None:
        self.sent.append((involved, reason, message))


def test_status_names_the_node() -> None:
    problems = runtimes.unserved_nodes(POLICY, FACTS)
    assert list(problems) == ["gpu-odd"]
    result = runtimes.outcome(READY, problems)
    assert (result.state, result.reason, result.message) == (
        NOT_READY,
        RUNTIME_NOT_RECOGNISED,
        problems["gpu-odd"],
    )


def test_a_failure_keeps_its_own_message_and_none_changes_nothing() -> None:
    failed = st.ReconcileOutcome.failed("boom")
    assert runtimes.outcome(failed, {"gpu-odd": "x"}) is failed
    assert runtimes.outcome(READY, {}) is READY


def test_one_event_per_node_and_message() -> None:
    kube, sent = Events(), set[tuple[str, ...]]()
    problems = runtimes.unserved_nodes(POLICY, FACTS)
    for _ in range(2):
        asyncio.run(runtimes.node_events(kube, problems, sent))  # type: ignore[arg-type]
    assert kube.sent == [
        ({"apiVersion": "v1", "kind": "Node", "name": "gpu-odd"}, RUNTIME_NOT_RECOGNISED, problems["gpu-odd"])
    ]
