"""GPU health signals, pure: a node's health report + what the node carries now + the policy ->
the NvidiaGPUReady condition, our taints, the metric state, and the writes that take the node
from what it carries to that (none when it already carries it). No I/O: controllers/units/health/unit.py
reads the facts and sends the writes.

The report is the health agent's annotation (vocabulary.HEALTH_REPORT_ANNOTATION), which the unit
parses once per pass (api/health.py's NodeReport, shared with the remediation machine): whether
validation passed, whether the agent stopped, one entry per GPU that is not healthy (bus id,
state, Xid, the catalogue's action, reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.health import GpuHealth, HealthReport, NodeReport
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_TAINT

# The metric's states (gpu_operator_node_gpu_health{node, state}): one is 1 per node.
METRIC_STATES = ("healthy", "warning", "quarantined", "remediating", "failed", "held")

# Condition reasons (CamelCase tokens, as Kubernetes conditions spell them).
HEALTHY = "GPUsHealthy"
VALIDATION_PENDING = "ValidationPending"
WARNING = "GPUWarning"
UNHEALTHY = "GPUUnhealthy"
GONE = "GPUGone"
UNREADABLE = "HealthReportUnreadable"
STOPPED = "HealthAgentStopped"
REMEDIATING = "Remediating"
REMEDIATION_FAILED = "RemediationFailed"
HELD = "RemediationHeld"


@dataclass(frozen=True, order=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def body(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True)
class HealthCondition:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


@dataclass(frozen=True)
class SignalFacts:
    """What the signals read of one node."""

    name: str
    report: NodeReport = NodeReport()  # the agent's annotation, parsed (or why not; or none)
    condition: HealthCondition | None = None  # our condition as the node carries it
    taints: tuple[Taint, ...] = ()  # the node's taints with our keys (see `ours`)
    remediation: str = ""  # HEALTH_STATE label: where remediation is ('' none)
    remediation_reason: str = ""  # why it failed or is held


@dataclass(frozen=True)
class DesiredHealth:
    condition: HealthCondition | None  # None: the node carries none of ours
    taints: tuple[Taint, ...]  # every taint with our keys the node should carry
    state: str | None  # metric state; None: no series for the node
    quarantine: bool = False


@dataclass(frozen=True)
class SignalWrites:
    """What to send for one node: each None/empty when nothing changes."""

    condition: HealthCondition | None = None
    delete_condition: bool = False
    taints: tuple[Taint, ...] | None = None  # the node's new set of our taints
    event: tuple[bool, str] | None = None  # (warning, message)

    @property
    def empty(self) -> bool:
        return (
            self.condition is None
            and not self.delete_condition
            and self.taints is None
            and self.event is None
        )


def describe(gpu: GpuHealth) -> str:
    xid = f"Xid {gpu.xid}" if gpu.xid is not None else "no Xid"
    text = f"GPU {gpu.bus} {gpu.state}: {xid}, action {gpu.action}"
    return f"{text} ({gpu.reason})" if gpu.reason else text


def _gpus_message(report: HealthReport) -> str:
    return "; ".join(describe(g) for g in sorted(report.gpus, key=lambda g: g.bus))


# Remediation states (HEALTH_STATE) -> the metric's state and the condition's reason.
REMEDIATION_METRIC = {
    "quarantined": "quarantined",
    "draining": "remediating",
    "acting": "remediating",
    "validating": "remediating",
    "failed": "failed",
    "held": "held",
}
_REMEDIATION_REASON = {"failed": REMEDIATION_FAILED, "held": HELD}


def managed(policy: HealthSpec) -> frozenset[str]:
    """The taint keys the signals write: the quarantine taint and the startup taint."""
    return frozenset((HEALTH_TAINT, policy.startupTaint.key))


def desire(facts: SignalFacts, policy: HealthSpec) -> DesiredHealth:
    """The condition, managed taints (see `managed`) and metric state this node should have."""
    startup = tuple(t for t in facts.taints if t.key == policy.startupTaint.key)
    quarantine_taint = Taint(HEALTH_TAINT, policy.taintEffect)
    report, error = facts.report.report, facts.report.error
    if report is None and error is None:
        held = facts.remediation in ("failed", "held")
        # no agent report: nothing of ours, unless remediation holds the node
        return DesiredHealth(
            None,
            startup + ((quarantine_taint,) if held else ()),
            REMEDIATION_METRIC.get(facts.remediation),
            quarantine=held,
        )
    if report is None:
        # keep the taints as they are: a report we cannot read proves nothing either way
        return DesiredHealth(
            HealthCondition("Unknown", UNREADABLE, str(error)),
            tuple(t for t in facts.taints if t.key in managed(policy)),
            REMEDIATION_METRIC.get(facts.remediation, "warning"),
        )
    if report.stopped and facts.remediation not in REMEDIATION_METRIC:
        return DesiredHealth(
            HealthCondition("Unknown", STOPPED, "the GPU health agent stopped; its last report may be stale"),
            tuple(t for t in facts.taints if t.key in managed(policy)),
            "warning",
        )
    worst = report.state
    if facts.remediation in REMEDIATION_METRIC:
        state = REMEDIATION_METRIC[facts.remediation]
        reason = _REMEDIATION_REASON.get(
            facts.remediation, REMEDIATING if state == "remediating" else UNHEALTHY
        )
        detail = _gpus_message(report) or "GPUs report healthy, waiting for validation"
        if facts.remediation_reason:
            detail = f"{detail}; {facts.remediation_reason}"
        return DesiredHealth(
            HealthCondition("False", reason, f"{facts.remediation}: {detail}"),
            startup + (quarantine_taint,),
            state,
            quarantine=True,
        )
    if worst in ("unhealthy", "gone"):
        reason = GONE if worst == "gone" else UNHEALTHY
        return DesiredHealth(
            HealthCondition("False", reason, _gpus_message(report)),
            startup + (quarantine_taint,),
            "quarantined",
            quarantine=True,
        )
    startup_left = () if report.validated and policy.startupTaint.enabled else startup
    if not report.validated:
        message = "GPU validation has not passed yet"
        if worst == "warning":
            message = f"{message}; {_gpus_message(report)}"
        return DesiredHealth(HealthCondition("False", VALIDATION_PENDING, message), startup_left, "warning")
    if worst == "warning":
        return DesiredHealth(
            HealthCondition("False", WARNING, _gpus_message(report)), startup_left, "warning"
        )
    return DesiredHealth(
        HealthCondition("True", HEALTHY, "validated; every GPU healthy"), startup_left, "healthy"
    )


def writes(facts: SignalFacts, desired: DesiredHealth, policy: HealthSpec) -> SignalWrites:
    """The writes from what the node carries to `desired` (empty when it carries it already)."""
    condition: HealthCondition | None = None
    delete = False
    event: tuple[bool, str] | None = None
    if desired.condition is None:
        delete = facts.condition is not None
    elif desired.condition != facts.condition:
        condition = desired.condition
        event = (
            condition.status != "True" and condition.reason != VALIDATION_PENDING,
            f"{HEALTH_CONDITION}={condition.status} ({condition.reason}): {condition.message}",
        )
    keys = managed(policy)
    have = sorted({t for t in facts.taints if t.key in keys})
    want = sorted(set(desired.taints))
    return SignalWrites(condition, delete, None if have == want else tuple(want), event)


def merged_taints(
    current: Sequence[Mapping[str, Any]], keys: frozenset[str], want: Sequence[Taint]
) -> list[dict[str, Any]]:
    """The node's whole taint list (as read just now) with the taints of `keys` replaced by `want`;
    every other taint exactly as it was, in its place."""
    kept = [dict(t) for t in current if str(t.get("key", "")) not in keys]
    return kept + [t.body() for t in sorted(set(want))]
