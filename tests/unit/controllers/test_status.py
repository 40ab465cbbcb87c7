"""Readiness rules and the Ready/Error condition pair (upstream-contract sections 2.3 and 2.5)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator import vocabulary
from gpu_operator.controllers import status as st


def ds(generation: int = 1, **status: int) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "status": status}


@pytest.mark.parametrize(
    ("obj", "ready"),
    [
        (ds(0), True),  # desired 0
        (ds(), False),  # a new DaemonSet not yet seen by its controller
        (ds(observedGeneration=1), True),
        (ds(desiredNumberScheduled=2, numberUnavailable=1), False),
        (
            ds(desiredNumberScheduled=2, observedGeneration=1, updatedNumberScheduled=2, numberAvailable=2),
            True,
        ),
        (
            ds(
                2, desiredNumberScheduled=2, observedGeneration=1, updatedNumberScheduled=2, numberAvailable=2
            ),
            False,
        ),
        (
            ds(desiredNumberScheduled=2, observedGeneration=1, updatedNumberScheduled=1, numberAvailable=2),
            False,
        ),
        (
            ds(desiredNumberScheduled=2, observedGeneration=1, updatedNumberScheduled=2, numberAvailable=1),
            False,
        ),
    ],
)
def test_daemonset_ready(obj: dict[str, Any], ready: bool) -> None:
    assert st.daemonset_ready(obj) is ready


@pytest.mark.parametrize(
    ("not_ready", "nfd", "gpus", "state", "reason"),
    [
        (["state-driver"], True, True, vocabulary.NOT_READY, vocabulary.OPERAND_NOT_READY),
        ([], False, False, vocabulary.READY, vocabulary.NFD_LABELS_MISSING),
        ([], True, False, vocabulary.READY, vocabulary.NO_GPU_NODES),
        ([], True, True, vocabulary.READY, vocabulary.RECONCILED),
    ],
)
def test_outcome(not_ready: list[str], nfd: bool, gpus: bool, state: str, reason: str) -> None:
    result = st.outcome(not_ready, nfd, gpus)
    assert (result.state, result.reason) == (state, reason)


def test_gpu_nodes_not_yet_labelled_are_not_ready() -> None:
    result = st.outcome([], True, False, unlabelled_gpu_nodes=2)
    assert (result.state, result.reason) == (vocabulary.NOT_READY, vocabulary.OPERAND_NOT_READY)
    assert "2 GPU node(s) not labelled" in result.message


def test_a_joining_unlabelled_node_does_not_change_a_not_ready_message() -> None:
    # during a rollout nodes join unlabelled for a moment: the message (and the status) must not
    # flip between the states and the node count from one reconcile to the next
    states = ["state-driver", "state-container-toolkit"]
    alone, joining = st.outcome(states, True, True), st.outcome(states, True, True, unlabelled_gpu_nodes=1)
    assert joining == alone
    assert (
        alone.message
        == "ClusterPolicy is not ready; states not ready: [state-driver state-container-toolkit]"
    )
    body = st.status_body(alone, "gpu-operator", None, 1)
    assert not st.status_differs(body, st.status_body(joining, "gpu-operator", body, 1))


def test_conditions_pair_and_stable_transition_time() -> None:
    ok = st.status_body(st.outcome([], True, True), "gpu-operator", None, 3)
    by_type = {c["type"]: c for c in ok["conditions"]}
    assert by_type["Ready"]["status"] == "True" and by_type["Ready"]["reason"] == vocabulary.RECONCILED
    assert by_type["Error"]["status"] == "False" and by_type["Error"]["reason"] == "Ready"
    again = st.status_body(st.outcome([], True, True), "gpu-operator", ok, 3)
    assert not st.status_differs(ok, again)  # same outcome: nothing to write

    failed = st.status_body(st.ReconcileOutcome.failed("spec.driver: no image"), "gpu-operator", ok, 4)
    by_type = {c["type"]: c for c in failed["conditions"]}
    assert failed["state"] == vocabulary.NOT_READY
    assert by_type["Ready"]["reason"] == "Error"
    assert by_type["Error"]["status"] == "True" and by_type["Error"]["reason"] == vocabulary.RECONCILE_FAILED
    assert by_type["Error"]["message"] == "spec.driver: no image"
    assert st.status_differs(ok, failed)
