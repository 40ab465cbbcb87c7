"""A node whose label patch keeps failing is retried alone, with backoff, logged once, counted."""

from __future__ import annotations

import logging

import pytest

from gpu_operator.controllers import metrics
from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.units.labels.labeller import LabelFailure, LabelReport, LabelRetries

FORBIDDEN = LabelFailure(403, 'nodes "gpu-1" is forbidden: denied by policy')


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _failures(code: str) -> float:
    value = metrics.LABEL_PATCH_FAILURES.labels(code)._value.get()  # noqa: SLF001
    return float(value)


def test_a_failing_node_backs_off_logs_once_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    retries = LabelRetries(Backoff(initial=1.0, cap=8.0), clock=clock)
    before = _failures("403")
    waits = []
    with caplog.at_level(logging.INFO, logger="gpu_operator.nodelabels"):
        for _ in range(6):
            retries.record(LabelReport(failed={"gpu-1": FORBIDDEN}))
            waits.append(retries.next_wait())
            assert retries.due() == set()  # not before its time
            clock.now += retries.next_wait() or 0
            assert retries.due() == {"gpu-1"}
            assert retries.next_wait() is None  # handed out once; only a new failure schedules it
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert _failures("403") - before == 6
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(warnings) == 1 and "gpu-1" in warnings[0].getMessage() and "HTTP 403" in warnings[0].getMessage()
    )

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpu_operator.nodelabels"):
        retries.record(LabelReport(failed={"gpu-1": LabelFailure(500, "etcdserver: timeout")}))
        retries.record(LabelReport(patched=["gpu-1"]))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "HTTP 500" in messages[0] and "after 7 failed attempts" in messages[1]
    assert retries.next_wait() is None and retries.failures == {}


def test_nodes_back_off_independently_and_a_deleted_node_is_forgotten() -> None:
    clock = Clock()
    retries = LabelRetries(Backoff(initial=1.0, cap=300.0), clock=clock)
    retries.record(LabelReport(failed={"a": FORBIDDEN}))
    retries.record(LabelReport(failed={"a": FORBIDDEN}))  # a: second failure, 2 s
    retries.record(LabelReport(patched=["c"], failed={"b": FORBIDDEN}))  # b: first, 1 s
    clock.now += 1
    assert retries.due() == {"b"}
    retries.forget("a")
    assert retries.next_wait() is None
