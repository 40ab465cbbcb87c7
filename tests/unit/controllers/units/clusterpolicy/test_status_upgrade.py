"""A ClusterPolicy with `driver.useNvidiaDriverCRD` stays not ready while a node an NVIDIADriver
owns has an upgrade pending, under way or failed (upstream's controllers/clusterpolicy_controller.go,
v26.7.0), and is not polled for it: node label events bring the next pass."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator import vocabulary as vocab
from gpu_operator.controllers import status as st
from gpu_operator.controllers.apply import ReconcileReport
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.clusterpolicy.reconcile import ClusterPolicyReconciler
from gpu_operator.controllers.views import ClusterPolicyView

UPGRADE_MESSAGE = (
    "NVIDIADriver upgrade has not completed; one or more NVIDIADriver-owned Nodes are marked "
    "pending, in-progress, or failed"
)


def owned(state: str | None, owner: str = "pool-a", **extra: str) -> dict[str, str]:
    labels = {vocab.DRIVER_OWNER: owner, **extra}
    if state is not None:
        labels[vocab.UPGRADE_STATE] = state
    return labels


UPGRADE_STATES = (
    vocab.UNKNOWN,
    vocab.UPGRADE_REQUIRED,
    vocab.CORDON_REQUIRED,
    vocab.WAIT_FOR_JOBS_REQUIRED,
    vocab.POD_DELETION_REQUIRED,
    vocab.DRAIN_REQUIRED,
    vocab.POD_RESTART_REQUIRED,
    vocab.VALIDATION_REQUIRED,
    vocab.UNCORDON_REQUIRED,
    vocab.UPGRADE_DONE,
    vocab.UPGRADE_FAILED,
)


@pytest.mark.parametrize("state", UPGRADE_STATES)
def test_every_state_but_none_and_done_is_incomplete(state: str) -> None:
    incomplete = state not in (vocab.UNKNOWN, vocab.UPGRADE_DONE)
    assert st.upgrade_incomplete(True, [owned(vocab.UPGRADE_DONE), owned(state)]) is incomplete


def test_failed_counts_missing_label_and_done_do_not() -> None:
    assert st.upgrade_incomplete(True, [owned(vocab.UPGRADE_FAILED)])
    assert not st.upgrade_incomplete(True, [owned(None), owned(vocab.UPGRADE_DONE)])
    assert not st.upgrade_incomplete(True, [])


def test_only_nvidiadriver_owned_nodes_not_skipped_count() -> None:
    cluster_policy_node = {vocab.UPGRADE_STATE: vocab.UPGRADE_REQUIRED}  # no owner label
    assert not st.upgrade_incomplete(True, [cluster_policy_node])
    assert not st.upgrade_incomplete(True, [owned(vocab.DRAIN_REQUIRED, **{vocab.UPGRADE_SKIP: "true"})])
    assert st.upgrade_incomplete(True, [owned(vocab.DRAIN_REQUIRED, **{vocab.UPGRADE_SKIP: "false"})])
    assert st.upgrade_incomplete(True, [owned(vocab.UPGRADE_REQUIRED, owner="")])  # the key is what counts


@pytest.mark.parametrize("use_crd", [False, None])
def test_without_use_nvidia_driver_crd_nothing_counts(use_crd: bool | None) -> None:
    assert not st.upgrade_incomplete(use_crd, [owned(vocab.UPGRADE_FAILED), owned(vocab.UPGRADE_REQUIRED)])


def test_upgrade_alone_is_not_ready_and_not_polled() -> None:
    result = st.outcome([], True, True, upgrading=True)
    assert (result.state, result.reason, result.poll) == (vocab.NOT_READY, vocab.OPERAND_NOT_READY, False)
    assert result.message == f"ClusterPolicy is not ready; {UPGRADE_MESSAGE}"
    assert st.outcome([], True, True, unlabelled_gpu_nodes=1, upgrading=True) == result


def test_states_and_upgrade_together_name_both_and_poll() -> None:
    result = st.outcome(["state-dcgm"], True, True, upgrading=True)
    assert result.message == f"ClusterPolicy is not ready; states not ready: [state-dcgm]; {UPGRADE_MESSAGE}"
    assert result.poll
    assert st.outcome(["state-dcgm"], True, True).poll


class StatusKube:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def patch_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)


def finish(outcome: st.ReconcileOutcome) -> tuple[ReconcileReport, list[dict[str, Any]]]:
    kube = StatusKube()
    reconciler = ClusterPolicyReconciler(kube, OperatorSettings(requeue_not_ready=5.0))  # type: ignore[arg-type]
    body = {"metadata": {"name": "cluster-policy", "uid": "u1"}, "spec": {}, "status": {}}
    view = ClusterPolicyView("cluster-policy", "u1", 1, "t", body)
    report = asyncio.run(
        reconciler._finish(
            ReconcileReport(), view, ReadSnapshot("gpu-operator", ClusterInfo("1.36.0")), outcome
        )
    )
    return report, kube.written


def test_an_upgrade_alone_writes_not_ready_and_sets_no_requeue() -> None:
    report, written = finish(st.outcome([], True, True, upgrading=True))
    assert [w["state"] for w in written] == [vocab.NOT_READY]
    assert report.requeue is None
    report, _ = finish(st.outcome(["state-dcgm"], True, True, upgrading=True))
    assert report.requeue == pytest.approx(5.0)
