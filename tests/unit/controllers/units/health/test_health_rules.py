"""The GPU health signals' rules: report + node + policy -> condition, taints, metric state, writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_operator.api.health import HealthReport, NodeReport, ReportError
from gpu_operator.api.healthpolicy import DEFAULT_STARTUP_TAINT, HealthSpec, StartupTaintSpec
from gpu_operator.controllers.units.health import rules as hr
from gpu_operator.vocabulary import HEALTH_TAINT

POLICY = HealthSpec()
STARTUP = HealthSpec(startupTaint=StartupTaintSpec(enabled=True))
NOEXEC = HealthSpec(taintEffect="NoExecute")
BUS = "0000:3b:00.0"


ORDER = ("healthy", "warning", "unhealthy", "gone")
ACTIONS = ("none", "restart-app", "reset-gpu", "reboot")


def report(validated: bool = True, *gpus: dict[str, Any], stopped: bool = False) -> str:
    """A report as the agent writes it (api/health.py's schema, version 1)."""
    worst = max((g["state"] for g in gpus), key=ORDER.index, default="healthy")
    action = max((g["action"] for g in gpus), key=ACTIONS.index, default="none")
    return json.dumps(
        {
            "v": 1,
            "validated": validated,
            "state": worst,
            "action": action,
            "healthy": 8 - len(gpus),
            "gpus": list(gpus),
            "sources": ["kmsg", "pci"],
            "missing": [] if validated else ["cuda"],
            "stopped": stopped,
        }
    )


def gpu(state: str, xid: int | None, action: str, reason: str = "") -> dict[str, Any]:
    return {"bus": BUS, "state": state, "xid": xid, "action": action, "reason": reason}


def signal(text: str | None, **kw: Any) -> hr.SignalFacts:
    """The signals' facts of node n with this report text (parsed as the unit parses it)."""
    return hr.SignalFacts("n", NodeReport.of(text), **kw)


XID79 = report(True, gpu("unhealthy", 79, "reboot", "GPU has fallen off the bus"))
XID13 = report(True, gpu("warning", 13, "restart-app", "graphics engine exception"))
QUARANTINE = hr.Taint(HEALTH_TAINT, "NoSchedule")
STARTUP_TAINT = hr.Taint(DEFAULT_STARTUP_TAINT, "NoSchedule")


@pytest.mark.parametrize(
    ("name", "facts", "policy", "status", "reason", "taints", "state"),
    [
        ("xid79 quarantines", signal(XID79), POLICY, "False", hr.UNHEALTHY, {QUARANTINE}, "quarantined"),
        (
            "NoExecute when asked",
            signal(XID79),
            NOEXEC,
            "False",
            hr.UNHEALTHY,
            {hr.Taint(HEALTH_TAINT, "NoExecute")},
            "quarantined",
        ),
        (
            "gone quarantines",
            signal(report(True, gpu("gone", 79, "reboot"))),
            POLICY,
            "False",
            hr.GONE,
            {QUARANTINE},
            "quarantined",
        ),
        ("xid13 warns, no taint", signal(XID13), POLICY, "False", hr.WARNING, set(), "warning"),
        (
            "pending validation",
            signal(report(False)),
            POLICY,
            "False",
            hr.VALIDATION_PENDING,
            set(),
            "warning",
        ),
        ("healthy", signal(report(True)), POLICY, "True", hr.HEALTHY, set(), "healthy"),
        (
            "healthy drops our taint",
            signal(report(True), taints=(QUARANTINE,)),
            POLICY,
            "True",
            hr.HEALTHY,
            set(),
            "healthy",
        ),
        (
            "startup taint stays while pending",
            signal(report(False), taints=(STARTUP_TAINT,)),
            STARTUP,
            "False",
            hr.VALIDATION_PENDING,
            {STARTUP_TAINT},
            "warning",
        ),
        (
            "startup taint goes once validated",
            signal(report(True), taints=(STARTUP_TAINT,)),
            STARTUP,
            "True",
            hr.HEALTHY,
            set(),
            "healthy",
        ),
        (
            "startup taint left alone when not enabled",
            signal(report(True), taints=(STARTUP_TAINT,)),
            POLICY,
            "True",
            hr.HEALTHY,
            {STARTUP_TAINT},
            "healthy",
        ),
        (
            "remediation holds",
            signal(report(True), remediation="held", remediation_reason="flapping"),
            POLICY,
            "False",
            hr.HELD,
            {QUARANTINE},
            "held",
        ),
        (
            "remediating",
            signal(XID79, remediation="draining"),
            POLICY,
            "False",
            hr.REMEDIATING,
            {QUARANTINE},
            "remediating",
        ),
        (
            "unreadable keeps taints",
            signal("{nope", taints=(QUARANTINE,)),
            POLICY,
            "Unknown",
            hr.UNREADABLE,
            {QUARANTINE},
            "warning",
        ),
        (
            "agent stopped keeps taints",
            signal(report(True, stopped=True), taints=(QUARANTINE,)),
            POLICY,
            "Unknown",
            hr.STOPPED,
            {QUARANTINE},
            "warning",
        ),
    ],
)
def test_desire(
    name: str,
    facts: hr.SignalFacts,
    policy: HealthSpec,
    status: str,
    reason: str,
    taints: set[hr.Taint],
    state: str,
) -> None:
    want = hr.desire(facts, policy)
    assert want.condition is not None
    assert (want.condition.status, want.condition.reason) == (status, reason), name
    assert set(want.taints) == taints, name
    assert want.state == state, name


def test_message_names_bus_xid_and_action() -> None:
    cond = hr.desire(signal(XID79), POLICY).condition
    assert cond is not None
    assert cond.message == f"GPU {BUS} unhealthy: Xid 79, action reboot (GPU has fallen off the bus)"


def test_no_report_no_signals_and_cleanup() -> None:
    assert hr.desire(signal(None), POLICY) == hr.DesiredHealth(None, (), None)
    old = signal(None, condition=hr.HealthCondition("False", hr.UNHEALTHY, "x"), taints=(QUARANTINE,))
    w = hr.writes(old, hr.desire(old, POLICY), POLICY)
    assert w.delete_condition and w.taints == () and w.condition is None


def test_no_writes_when_already_as_desired() -> None:
    for text, taints in ((XID79, (QUARANTINE,)), (XID13, ()), (report(True), ()), (report(False), ())):
        first = signal(text, taints=taints)
        cond = hr.desire(first, POLICY).condition
        settled = signal(text, condition=cond, taints=taints)
        assert hr.writes(settled, hr.desire(settled, POLICY), POLICY).empty


def test_first_sight_writes_condition_taint_and_one_warning_event() -> None:
    facts = signal(XID79)
    w = hr.writes(facts, hr.desire(facts, POLICY), POLICY)
    assert w.condition is not None and w.condition.reason == hr.UNHEALTHY
    assert w.taints == (QUARANTINE,)
    assert w.event is not None and w.event[0] is True


def test_others_taints_are_never_touched() -> None:
    other = hr.Taint("nvidia.com/gpu", "NoSchedule", "present")
    facts = signal(report(True), taints=(other,))
    assert hr.writes(facts, hr.desire(facts, POLICY), POLICY).taints is None
    current = [
        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        other.body(),
        {"key": HEALTH_TAINT, "effect": "NoSchedule"},
    ]
    assert hr.merged_taints(current, hr.managed(POLICY), ()) == current[:2]
    assert hr.merged_taints(current[:2], hr.managed(POLICY), (QUARANTINE,)) == [
        *current[:2],
        QUARANTINE.body(),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "{nope",
        '{"v": 1, "validated": true}',
        report(True, gpu("unhealthy", 79, "reboot")).replace('"unhealthy"', '"sick"'),
        report(True, gpu("unhealthy", 79, "reboot")).replace('"reboot"', '"pray"'),
    ],
)
def test_bad_reports_are_refused(text: str) -> None:
    with pytest.raises(ReportError):
        HealthReport.parse(text)
    read = NodeReport.of(text)
    assert read.report is None and read.error is not None and read.error.startswith("annotation ")
