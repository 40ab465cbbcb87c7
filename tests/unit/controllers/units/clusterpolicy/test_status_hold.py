"""While a ClusterPolicy stays not ready for the same reason, a new message is held
(settings.status_message_hold); a change of state or reason is written at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator.controllers import status as st
from gpu_operator.controllers.apply import ReconcileReport
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.clusterpolicy import reconcile as clusterpolicy
from gpu_operator.controllers.units.clusterpolicy.reconcile import ClusterPolicyReconciler
from gpu_operator.controllers.views import ClusterPolicyView


class StatusKube:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def patch_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)


def view(status: dict[str, Any]) -> ClusterPolicyView:
    body = {"metadata": {"name": "cluster-policy", "uid": "u1"}, "spec": {}, "status": status}
    return ClusterPolicyView("cluster-policy", "u1", 1, "t", body)


def message(status: dict[str, Any]) -> str:
    return str(next(c["message"] for c in status["conditions"] if c["type"] == "Error"))


def test_a_new_not_ready_message_waits_out_the_hold_and_a_new_reason_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(clusterpolicy, "monotonic", lambda: clock[0])
    kube = StatusKube()
    reconciler = ClusterPolicyReconciler(kube, OperatorSettings(status_message_hold=5.0))  # type: ignore[arg-type]
    snap = ReadSnapshot("gpu-operator", ClusterInfo("1.36.0"))
    shown: dict[str, Any] = {}  # what the policy's watch shows: our last write

    def finish(outcome: st.ReconcileOutcome) -> ReconcileReport:
        report = asyncio.run(reconciler._finish(ReconcileReport(), view(shown), snap, outcome))
        if kube.written:
            shown.update(kube.written[-1])
        return report

    finish(st.outcome(["state-driver", "state-dcgm"], True, True))
    assert len(kube.written) == 1  # the first not-ready status: at once

    clock[0] += 1.0
    report = finish(st.outcome(["state-dcgm"], True, True))
    assert len(kube.written) == 1  # same reason, new list: held
    assert report.requeue == pytest.approx(4.0)  # the pass at the end of the hold writes it

    clock[0] += 4.0
    finish(st.outcome(["state-dcgm"], True, True))
    assert len(kube.written) == 2 and message(kube.written[-1]).endswith("[state-dcgm]")

    clock[0] += 0.5
    finish(st.ReconcileOutcome.failed("spec.driver.version: empty (fix the field in the ClusterPolicy)"))
    assert len(kube.written) == 3  # a new reason: at once
    clock[0] += 0.5
    finish(st.ReconcileOutcome.failed("spec.dcgm.version: empty (fix the field in the ClusterPolicy)"))
    assert len(kube.written) == 4  # an error's new message is never held
    clock[0] += 0.5
    finish(st.outcome([], True, True))
    assert len(kube.written) == 5 and kube.written[-1]["state"] == "ready"  # ready: at once
