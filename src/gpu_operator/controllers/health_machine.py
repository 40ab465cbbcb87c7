"""GPU remediation, a pure and resumable state machine: node facts + spec.health.remediation + now
-> per node the next step. Everything it remembers lives on the Node (the HEALTH_STATE label and
nvidia.com/gpu-health.* annotations), so an operator restarted mid-way resumes where the node is,
as the driver upgrade machine does (controllers/upgrade_state.py, whose eviction step and pod facts
it reuses). No I/O: controllers/health_exec.py carries the steps out.

    (none) --unhealthy--> quarantined --slot--> draining --GPU pods gone--> acting --> validating
       ^                       |                    | (timeout: attempt failed)           |
       |                       | recovered          v                                     v
       +--- released <---------+              draining again, next action <-- validation timed out
                                              ... attempts >= maxAttempts --> failed (stays quarantined)
    flapping (transitions within the window) --> held;   `health hold` --> held;   `health retry` --> quarantined
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.health import HealthReport, ReportError
from gpu_operator.api.healthpolicy import RemediationSpec
from gpu_operator.controllers import upgrade_state as us
from gpu_operator.controllers.cache import HEALTH_ANNOTATION_PREFIX, NodeView
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_REASON_ANNOTATION,
    HEALTH_REBOOT_REQUESTED,
    HEALTH_REPORT_ANNOTATION,
    HEALTH_RESET_REQUESTED,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
    UPGRADE_DRAIN_START_ANNOTATION,
    UPGRADE_STATE,
)

PREFIX = HEALTH_ANNOTATION_PREFIX
SINCE = HEALTH_SINCE_ANNOTATION  # when the current state began (epoch seconds)
ATTEMPTS = HEALTH_ATTEMPTS_ANNOTATION  # failed attempts so far
STEP = f"{PREFIX}step"  # index into the policy's actions of the action now or next
ACTION = f"{PREFIX}action"  # the action last carried out
REASON = HEALTH_REASON_ANNOTATION  # why the node failed or is held
UNHEALTHY_AT = f"{PREFIX}unhealthy-at"  # when it turned unhealthy, comma-separated (flapping window)
INITIALLY_UNSCHEDULABLE = f"{PREFIX}initially-unschedulable"  # cordoned before we began: left cordoned
DRAIN_START = f"{PREFIX}drain-start"
# Requests to the node agent (node/health/requests.py acts, then removes the annotation).
RESET_REQUESTED = HEALTH_RESET_REQUESTED
REBOOT_REQUESTED = HEALTH_REBOOT_REQUESTED

QUARANTINED, DRAINING, ACTING, VALIDATING, FAILED, HELD = (
    "quarantined", "draining", "acting", "validating", "failed", "held")
STATES = (QUARANTINED, DRAINING, ACTING, VALIDATING, FAILED, HELD)
ACTIVE = (DRAINING, ACTING, VALIDATING)  # what maxUnavailable bounds, and what a driver upgrade waits for
# How strong each remediation is, and the weakest one that can fix each catalogue action.
STRENGTH = {"restart-device-plugin": 1, "reset-gpu": 2, "reload-driver": 3, "reboot": 4, "external": 5}
NEEDED = {"none": 1, "restart-app": 1, "reset-gpu": 2, "reboot": 4}
_CLEAR_REQUESTS: dict[str, str | None] = {RESET_REQUESTED: None, REBOOT_REQUESTED: None, DRAIN_START: None}


@dataclass(frozen=True)
class Facts:
    """What the machine reads of one node."""

    name: str
    state: str = ""  # HEALTH_STATE label ('' none)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    report: HealthReport | None = None  # None: no report, or one that cannot be read
    pods: Sequence[us.PodFacts] = ()  # read only while draining

    @property
    def broken(self) -> bool:
        """A GPU unhealthy or gone: what quarantines a node."""
        return self.report is not None and bool(self.report.unhealthy)

    @property
    def recovered(self) -> bool:
        """Validated, the agent running, no GPU unhealthy or gone, and no request pending."""
        r = self.report
        return (r is not None and r.validated and not r.stopped and not r.unhealthy
                and RESET_REQUESTED not in self.annotations and REBOOT_REQUESTED not in self.annotations)

    def number(self, key: str) -> int:
        try:
            return int(float(self.annotations.get(key, "")))
        except ValueError:
            return 0


def node_facts(view: NodeView, pods: Sequence[us.PodFacts] = ()) -> Facts:
    text = view.annotations.get(HEALTH_REPORT_ANNOTATION)
    report: HealthReport | None = None
    if text is not None:
        try:
            report = HealthReport.parse(text)
        except ReportError:
            report = None
    # the machine's own memory: our prefix, but not the agent's report (which shares it)
    notes = {k: v for k, v in view.annotations.items() if k.startswith(PREFIX) and k != HEALTH_REPORT_ANNOTATION}
    return Facts(view.name, view.labels.get(HEALTH_STATE, ""), notes, view.selectable,
                 view.unschedulable, report, pods)


@dataclass(frozen=True)
class Step:
    """What to do for one node this pass (empty: nothing)."""

    node: str
    state: str | None = None  # new HEALTH_STATE
    remove_state: bool = False
    notes: Mapping[str, str | None] = field(default_factory=dict)  # annotations (None: remove)
    labels: Mapping[str, str | None] = field(default_factory=dict)  # other labels (the handoff)
    cordon: bool | None = None
    evict: tuple[us.PodFacts, ...] = ()
    action: str = ""  # restart-device-plugin | reload-driver: pods to delete now
    result: str = ""  # succeeded | failed: an attempt ended (the counter)
    message: str = ""

    @property
    def empty(self) -> bool:
        return (self.state is None and not self.remove_state and not self.notes and not self.labels
                and self.cordon is None and not self.evict and not self.action and not self.result)


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    busy: bool  # a node is on its way: poll for timeouts


def _to(node: Facts, state: str, now: float, message: str, notes: Mapping[str, str | None] | None = None,
        **kw: Any) -> Step:
    return Step(node.name, state=state, notes={SINCE: str(int(now)), **(notes or {})}, message=message, **kw)


def _release(node: Facts, spec: RemediationSpec, result: str = "") -> Step:
    """Back to service: state and notes gone (the flapping record stays), uncordoned unless the node
    was cordoned before we began, the handoff label removed."""
    notes: dict[str, str | None] = {k: None for k in node.annotations if k != UNHEALTHY_AT}
    labels: dict[str, str | None] = {}
    if spec.externalHandoff is not None and spec.externalHandoff.label in node.labels:
        labels[spec.externalHandoff.label] = None
    # we cordoned it (draining wrote "false": it was schedulable before) -> uncordon
    cordon = False if node.annotations.get(INITIALLY_UNSCHEDULABLE) == "false" else None
    return Step(node.name, remove_state=True, notes=notes, labels=labels, cordon=cordon, result=result,
                message="GPUs healthy and validated: node released")


def _first_step(node: Facts, spec: RemediationSpec) -> int | None:
    """The first configured action strong enough for what the report asks (None: none is)."""
    needed = max((NEEDED.get(g.action, 1) for g in node.report.unhealthy), default=1) if node.report else 1
    return next((i for i, a in enumerate(spec.actions) if STRENGTH[a] >= needed), None)


def _attempt_failed(node: Facts, spec: RemediationSpec, now: float, why: str) -> Step:
    attempts = node.number(ATTEMPTS) + 1
    if attempts >= spec.maxAttempts:
        reason = f"{attempts} remediation attempts failed (maxAttempts {spec.maxAttempts}); last: {why}"
        return _to(node, FAILED, now, reason, {ATTEMPTS: str(attempts), REASON: reason, **_CLEAR_REQUESTS},
                   result="failed")
    nxt = min(node.number(STEP) + 1, len(spec.actions) - 1)
    return _to(node, DRAINING, now, f"attempt {attempts} failed ({why}); escalating to {spec.actions[nxt]}",
               {ATTEMPTS: str(attempts), STEP: str(nxt), REASON: None, **_CLEAR_REQUESTS}, result="failed")


def _flapping(node: Facts, spec: RemediationSpec, now: float) -> tuple[list[str], bool]:
    window = spec.flapping.windowSeconds
    times = [t for t in node.annotations.get(UNHEALTHY_AT, "").split(",") if t.strip().isdigit()
             and now - int(t) <= window]
    times.append(str(int(now)))
    return times[-spec.flapping.transitions:], len(times) >= spec.flapping.transitions


def decide(node: Facts, spec: RemediationSpec, now: float, may_start: bool) -> Step:
    state = node.state
    if state == "":
        if not node.broken:
            return Step(node.name)
        times, flapping = _flapping(node, spec, now)
        if flapping:
            reason = (f"flapping: unhealthy {len(times)} times within {spec.flapping.windowSeconds}s; "
                      "held instead of cycled (gpu-operator health retry NODE)")
            return _to(node, HELD, now, reason, {UNHEALTHY_AT: ",".join(times), REASON: reason})
        return _to(node, QUARANTINED, now, "GPU unhealthy: quarantined", {UNHEALTHY_AT: ",".join(times)})
    if state == QUARANTINED:
        if node.recovered and not node.broken:
            return _release(node, spec)
        if node.labels.get(UPGRADE_STATE) in us.ACTIVE or not may_start:
            return Step(node.name)
        first = _first_step(node, spec) if STEP not in node.annotations else node.number(STEP)
        if first is None:
            reason = (f"no configured action is strong enough (the catalogue asks for "
                      f"{', '.join(sorted({g.action for g in node.report.unhealthy})) if node.report else '?'}; "
                      f"actions: {', '.join(spec.actions)})")
            return _to(node, FAILED, now, reason, {REASON: reason})
        notes = {STEP: str(first), INITIALLY_UNSCHEDULABLE: "true" if node.unschedulable else "false"}
        return _to(node, DRAINING, now, "draining the node's GPU pods", notes, cordon=True)
    if state == DRAINING:
        return _drain(node, spec, now)
    if state == ACTING:
        return _act(node, spec, now)
    if state == VALIDATING:
        if node.recovered and not (spec.externalHandoff is not None and spec.externalHandoff.label in node.labels
                                   and node.annotations.get(ACTION) == "external"):
            return _release(node, spec, result="succeeded")
        since = node.number(SINCE)
        if now - since > spec.validationTimeoutSeconds:
            return _attempt_failed(node, spec, now, f"not validated healthy within {spec.validationTimeoutSeconds}s "
                                   f"after {node.annotations.get(ACTION, '?')}")
        return Step(node.name)
    return Step(node.name)  # failed, held: only `health retry` moves them


def _drain(node: Facts, spec: RemediationSpec, now: float) -> Step:
    pods = [p for p in node.pods if p.gpu and not p.daemonset and not p.mirror and p.drain_match
            and p.phase in ("Running", "Pending")]
    loose = [p for p in pods if not p.controlled]
    if loose:
        names = ", ".join(f"{p.namespace}/{p.name}" for p in loose)
        return _attempt_failed(node, spec, now, f"GPU pod {names} has no controller: not evicted (it would not come "
                               "back); delete it, or exclude it with health.remediation.podSelector")
    upgrade_node = us.NodeFacts(node.name, annotations={UPGRADE_DRAIN_START_ANNOTATION: node.annotations[DRAIN_START]}
                                if DRAIN_START in node.annotations else {})
    outcome, step = us._eviction(upgrade_node, pods, UPGRADE_DRAIN_START_ANNOTATION, spec.drainTimeoutSeconds, now,
                                 True, True, "GPU pod drain")
    if outcome == "done":
        return _to(node, ACTING, now, "GPU pods drained", {DRAIN_START: None})
    if outcome.startswith("failed:"):
        return _attempt_failed(node, spec, now, outcome[7:])
    if step is None:
        return Step(node.name)
    notes = {DRAIN_START: step.annotations[UPGRADE_DRAIN_START_ANNOTATION]} \
        if UPGRADE_DRAIN_START_ANNOTATION in step.annotations else {}
    return Step(node.name, notes=notes, evict=step.evict, message=step.message)


def _act(node: Facts, spec: RemediationSpec, now: float) -> Step:
    index = min(node.number(STEP), len(spec.actions) - 1)
    action = spec.actions[index]
    notes: dict[str, str | None] = {ACTION: action}
    labels: dict[str, str | None] = {}
    pods = ""
    if action in ("restart-device-plugin", "reload-driver"):
        pods = action
    elif action == "reset-gpu":
        buses = sorted(g.bus for g in node.report.unhealthy) if node.report else []
        notes[RESET_REQUESTED] = ",".join(buses) or "all"
    elif action == "reboot":
        notes[REBOOT_REQUESTED] = str(int(now))
    elif action == "external" and spec.externalHandoff is not None:
        labels[spec.externalHandoff.label] = spec.externalHandoff.value
    return _to(node, VALIDATING, now, f"remediation: {action}", notes, labels=labels, action=pods)


def plan(nodes: Sequence[Facts], spec: RemediationSpec, now: float) -> Plan:
    """Every node's step; at most maxUnavailable GPU nodes in an active state."""
    gpu_nodes = [n for n in nodes if n.report is not None or n.state]
    active = sum(1 for n in gpu_nodes if n.state in ACTIVE)
    room = max(0, spec.unavailable_limit(len(gpu_nodes)) - active)
    steps: list[Step] = []
    for node in sorted(gpu_nodes, key=lambda n: (n.state != QUARANTINED, n.number(SINCE), n.name)):
        may_start = room > 0
        step = decide(node, spec, now, may_start)
        if step.state in ACTIVE and node.state not in ACTIVE:
            room -= 1
        if not step.empty:
            steps.append(step)
    busy = any(n.state in (QUARANTINED, *ACTIVE) for n in gpu_nodes) or any(
        s.state in (QUARANTINED, *ACTIVE) for s in steps)
    return Plan(tuple(steps), busy)


def release_all(nodes: Sequence[Facts], spec: RemediationSpec) -> Plan:
    """Remediation switched off: every node it holds goes back (uncordoned where we cordoned it),
    except one held by hand or for flapping (it waits for `health retry`)."""
    return Plan(tuple(_release(n, spec) for n in nodes if n.state and n.state != HELD), False)


def retry_patch(annotations: Mapping[str, str]) -> dict[str, Any]:
    """`gpu-operator health retry NODE`: back to quarantined, attempts and reason forgotten."""
    notes: dict[str, str | None] = {ATTEMPTS: None, REASON: None, STEP: None, ACTION: None, UNHEALTHY_AT: None,
                                    **_CLEAR_REQUESTS}
    return {"metadata": {"labels": {HEALTH_STATE: QUARANTINED}, "annotations": notes}}


def hold_patch(reason: str, now: float) -> dict[str, Any]:
    """`gpu-operator health hold NODE`: held (stays quarantined) until `health retry`."""
    return {"metadata": {"labels": {HEALTH_STATE: HELD},
                         "annotations": {REASON: reason, SINCE: str(int(now)), **_CLEAR_REQUESTS}}}
