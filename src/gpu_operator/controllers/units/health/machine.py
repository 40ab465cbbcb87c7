"""GPU remediation, a pure and resumable state machine: node facts + spec.health.remediation + now
-> per node the next step. Everything it remembers lives on the Node (the HEALTH_STATE label and
nvidia.com/gpu-health.* annotations), so an operator restarted mid-way resumes where the node is,
as the driver upgrade machine does (controllers/units/upgrade/state.py); its drain is the one both use
(controllers/drain.py). No I/O: controllers/units/health/executor.py carries the steps out.

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

from gpu_operator.api.healthpolicy import RemediationSpec
from gpu_operator.controllers import drain as node_drain
from gpu_operator.controllers.units.health.remediationfacts import (
    ACTING,
    ACTION,
    ACTIVE,
    ANSWERED,
    ATTEMPTS,
    CLEAR_REQUESTS,
    DRAIN_START,
    DRAINING,
    FAILED,
    GPU_CLIENT_APPS,
    GPU_CLIENTS,
    HELD,
    INITIALLY_UNSCHEDULABLE,
    PAUSED,
    PAUSED_VALUE,
    PREFIX,
    QUARANTINED,
    REASON,
    REQUESTED,
    REVALIDATED,
    SINCE,
    STEP,
    UNHEALTHY_AT,
    VALIDATING,
    VALIDATOR_RESTART,
    RemediationFacts,
    node_facts,
    request_id,
    request_text,
    resumed,
)
from gpu_operator.vocabulary import HEALTH_STATE, UPGRADE_ACTIVE, UPGRADE_STATE

# The node's memory, its facts and its request texts live in remediationfacts.py; every name stays
# importable from here.
__all__ = [
    "ACTING",
    "ACTION",
    "ACTIVE",
    "ANSWERED",
    "ATTEMPTS",
    "CLEAR_REQUESTS",
    "DRAINING",
    "DRAIN_START",
    "FAILED",
    "GPU_CLIENTS",
    "GPU_CLIENT_APPS",
    "HELD",
    "INITIALLY_UNSCHEDULABLE",
    "NEEDED",
    "PAUSED",
    "PAUSED_VALUE",
    "PREFIX",
    "RemediationPlan",
    "QUARANTINED",
    "REASON",
    "REQUESTED",
    "REVALIDATED",
    "RemediationFacts",
    "SINCE",
    "STEP",
    "STRENGTH",
    "RemediationStep",
    "UNHEALTHY_AT",
    "VALIDATING",
    "VALIDATOR_RESTART",
    "decide",
    "hold_patch",
    "node_facts",
    "plan",
    "release_all",
    "request_id",
    "request_text",
    "resumed",
    "retry_patch",
]

# How strong each remediation is, and the weakest one that can fix each catalogue action.
STRENGTH = {"restart-device-plugin": 1, "reset-gpu": 2, "reload-driver": 3, "reboot": 4, "external": 5}
NEEDED = {"none": 1, "restart-app": 1, "reset-gpu": 2, "reboot": 4}


@dataclass(frozen=True)
class RemediationStep:
    """What to do for one node this pass (empty: nothing)."""

    node: str
    state: str | None = None  # new HEALTH_STATE
    remove_state: bool = False
    notes: Mapping[str, str | None] = field(default_factory=dict)  # annotations (None: remove)
    labels: Mapping[str, str | None] = field(default_factory=dict)  # other labels (the handoff)
    cordon: bool | None = None
    evict: tuple[node_drain.PodFacts, ...] = ()
    action: str = ""  # restart-device-plugin | reload-driver | revalidate: pods to delete now
    request: str = ""  # the node's entry to put in the requests Secret (request_text)
    withdraw: bool = False  # the node's entry to remove from the requests Secret
    result: str = ""  # succeeded | failed: an attempt ended (the counter)
    message: str = ""

    @property
    def empty(self) -> bool:
        return (
            self.state is None
            and not self.remove_state
            and not self.notes
            and not self.labels
            and self.cordon is None
            and not self.evict
            and not self.action
            and not self.result
            and not self.request
            and not self.withdraw
        )


@dataclass(frozen=True)
class RemediationPlan:
    steps: tuple[RemediationStep, ...]
    busy: bool  # a node is on its way: poll for timeouts


def _to(
    node: RemediationFacts,
    state: str,
    now: float,
    message: str,
    notes: Mapping[str, str | None] | None = None,
    **kw: Any,
) -> RemediationStep:
    return RemediationStep(
        node.name, state=state, notes={SINCE: str(int(now)), **(notes or {})}, message=message, **kw
    )


def _release(node: RemediationFacts, spec: RemediationSpec, result: str = "") -> RemediationStep:
    """Back to service: state and notes gone (the flapping record stays), uncordoned unless the node
    was cordoned before we began, the handoff label removed."""
    notes: dict[str, str | None] = {k: None for k in node.annotations if k != UNHEALTHY_AT}
    labels: dict[str, str | None] = {}
    if spec.externalHandoff is not None and spec.externalHandoff.label in node.labels:
        labels[spec.externalHandoff.label] = None
    # we cordoned it (draining wrote "false": it was schedulable before) -> uncordon
    cordon = False if node.annotations.get(INITIALLY_UNSCHEDULABLE) == "false" else None
    labels.update(resumed(node))
    return RemediationStep(
        node.name,
        remove_state=True,
        notes=notes,
        labels=labels,
        cordon=cordon,
        result=result,
        withdraw=node.annotations.get(ACTION) in REQUESTED,
        message="GPUs healthy and validated: node released",
    )


def _first_step(node: RemediationFacts, spec: RemediationSpec) -> int | None:
    """The first configured action strong enough for what the report asks (None: none is)."""
    needed = max((NEEDED.get(g.action, 1) for g in node.report.unhealthy), default=1) if node.report else 1
    return next((i for i, a in enumerate(spec.actions) if STRENGTH[a] >= needed), None)


def _attempt_failed(node: RemediationFacts, spec: RemediationSpec, now: float, why: str) -> RemediationStep:
    attempts = node.number(ATTEMPTS) + 1
    if attempts >= spec.maxAttempts:
        reason = f"{attempts} remediation attempts failed (maxAttempts {spec.maxAttempts}); last: {why}"
        return _to(
            node,
            FAILED,
            now,
            reason,
            {ATTEMPTS: str(attempts), REASON: reason, **CLEAR_REQUESTS},
            result="failed",
            withdraw=node.annotations.get(ACTION) in REQUESTED,
            labels=resumed(node),
        )
    nxt = min(node.number(STEP) + 1, len(spec.actions) - 1)
    return _to(
        node,
        DRAINING,
        now,
        f"attempt {attempts} failed ({why}); escalating to {spec.actions[nxt]}",
        {ATTEMPTS: str(attempts), STEP: str(nxt), REASON: None, **CLEAR_REQUESTS},
        result="failed",
        withdraw=node.annotations.get(ACTION) in REQUESTED,
        labels=resumed(node),
    )


def _flapping(node: RemediationFacts, spec: RemediationSpec, now: float) -> tuple[list[str], bool]:
    window = spec.flapping.windowSeconds
    times = [
        t
        for t in node.annotations.get(UNHEALTHY_AT, "").split(",")
        if t.strip().isdigit() and now - int(t) <= window
    ]
    times.append(str(int(now)))
    return times[-spec.flapping.transitions :], len(times) >= spec.flapping.transitions


def decide(node: RemediationFacts, spec: RemediationSpec, now: float, may_start: bool) -> RemediationStep:
    state = node.state
    if state == "":
        if not node.broken:
            return RemediationStep(node.name)
        times, flapping = _flapping(node, spec, now)
        if flapping:
            reason = (
                f"flapping: unhealthy {len(times)} times within {spec.flapping.windowSeconds}s; "
                "held instead of cycled (gpu-operator health retry NODE)"
            )
            return _to(node, HELD, now, reason, {UNHEALTHY_AT: ",".join(times), REASON: reason})
        return _to(node, QUARANTINED, now, "GPU unhealthy: quarantined", {UNHEALTHY_AT: ",".join(times)})
    if state == QUARANTINED:
        if node.recovered and not node.broken:
            return _release(node, spec)
        if node.labels.get(UPGRADE_STATE) in UPGRADE_ACTIVE or not may_start:
            return RemediationStep(node.name)
        first = _first_step(node, spec) if STEP not in node.annotations else node.number(STEP)
        if first is None:
            reason = (
                f"no configured action is strong enough (the catalogue asks for "
                f"{', '.join(sorted({g.action for g in node.report.unhealthy})) if node.report else '?'}; "
                f"actions: {', '.join(spec.actions)})"
            )
            return _to(node, FAILED, now, reason, {REASON: reason})
        notes = {STEP: str(first), INITIALLY_UNSCHEDULABLE: "true" if node.unschedulable else "false"}
        return _to(node, DRAINING, now, "draining the node's GPU pods", notes, cordon=True)
    if state == DRAINING:
        return _drain(node, spec, now)
    if state == ACTING:
        return _act(node, spec, now)
    if state == VALIDATING:
        action = node.annotations.get(ACTION, "")
        if node.pending and node.report is not None and node.report.answered == request_id(node):
            # carried out: the request withdrawn, the node's validation restarted (a reboot restarts it)
            done: dict[str, str | None] = {
                ANSWERED: node.annotations.get(SINCE, ""),
                REVALIDATED: f"{now:.3f}",
                PAUSED: None,
            }
            return RemediationStep(
                node.name,
                notes=done,
                withdraw=True,
                labels=resumed(node),
                action="" if action == "reboot" else VALIDATOR_RESTART,
                message=f"the node agent carried out {action}; request withdrawn, validation restarted",
            )
        handed = (
            spec.externalHandoff is not None
            and spec.externalHandoff.label in node.labels
            and action == "external"
        )
        if action == "external" and not handed and REVALIDATED not in node.annotations:
            return RemediationStep(
                node.name,
                notes={REVALIDATED: f"{now:.3f}"},
                action=VALIDATOR_RESTART,
                message="handed back by the external system: validation restarted",
            )
        if not node.pending and not handed and node.fresh and node.recovered:
            return _release(node, spec, result="succeeded")
        since = node.number(SINCE)
        if now - since > spec.validationTimeoutSeconds:
            return _attempt_failed(
                node,
                spec,
                now,
                f"not validated healthy within {spec.validationTimeoutSeconds}s "
                f"after {node.annotations.get(ACTION, '?')}",
            )
        return RemediationStep(node.name)
    return RemediationStep(node.name)  # failed, held: only `health retry` moves them


def _drain(node: RemediationFacts, spec: RemediationSpec, now: float) -> RemediationStep:
    pods = [
        p
        for p in node.pods
        if p.gpu and not p.daemonset and not p.mirror and p.drain_match and p.phase in ("Running", "Pending")
    ]
    loose = [p for p in pods if not p.controlled]
    if loose:
        names = ", ".join(f"{p.namespace}/{p.name}" for p in loose)
        return _attempt_failed(
            node,
            spec,
            now,
            f"GPU pod {names} has no controller: not evicted (it would not come "
            "back); delete it, or exclude it with health.remediation.podSelector",
        )
    d = node_drain.decide(
        pods,
        node_drain.started_at(node.annotations.get(DRAIN_START)),
        spec.drainTimeoutSeconds,
        now,
        force=True,
        empty_dir=True,
        what="GPU pod drain",
    )
    if d.outcome == node_drain.DONE:
        return _to(node, ACTING, now, "GPU pods drained", {DRAIN_START: None})
    if d.outcome == node_drain.FAILED:
        return _attempt_failed(node, spec, now, d.reason)
    notes = {DRAIN_START: d.start} if d.start is not None else {}
    return RemediationStep(node.name, notes=notes, evict=d.evict, message=d.message)


def _act(node: RemediationFacts, spec: RemediationSpec, now: float) -> RemediationStep:
    index = min(node.number(STEP), len(spec.actions) - 1)
    action = spec.actions[index]
    notes: dict[str, str | None] = {ACTION: action, ANSWERED: None}
    labels: dict[str, str | None] = {}
    pods = request = ""
    if action in ("restart-device-plugin", "reload-driver"):
        pods = action  # and the validator's pod: a validation newer than the restart releases the node
        notes[REVALIDATED] = f"{now:.3f}"
    elif action == "reset-gpu" and PAUSED not in node.annotations:
        # first the GPU clients leave the node (their pods hold the GPUs); the request comes after
        pause = {k: PAUSED_VALUE for k in GPU_CLIENTS if node.labels.get(k) == "true"}
        return RemediationStep(
            node.name,
            notes={PAUSED: ",".join(sorted(pause)), SINCE: str(int(now))},
            labels=pause,
            message=f"pausing the GPU clients for the reset: {', '.join(sorted(pause)) or 'none'}",
        )
    elif action == "reset-gpu" and node.clients:
        if now - node.number(SINCE) > spec.drainTimeoutSeconds:
            return _attempt_failed(
                node,
                spec,
                now,
                f"GPU client pods still on the node after "
                f"{spec.drainTimeoutSeconds}s: {', '.join(node.clients)}",
            )
        return RemediationStep(node.name)
    if action in REQUESTED:
        buses = sorted(g.bus for g in node.report.unhealthy) if node.report else []
        gpus = (buses or ["all"]) if action == "reset-gpu" else []
        request = request_text(node.name, action, gpus, node.number(ATTEMPTS), str(int(now)))
    elif action == "external" and spec.externalHandoff is not None:
        labels[spec.externalHandoff.label] = spec.externalHandoff.value
    return _to(
        node, VALIDATING, now, f"remediation: {action}", notes, labels=labels, action=pods, request=request
    )


def plan(nodes: Sequence[RemediationFacts], spec: RemediationSpec, now: float) -> RemediationPlan:
    """Every node's step; at most maxUnavailable GPU nodes in an active state."""
    gpu_nodes = [n for n in nodes if n.report is not None or n.state]
    active = sum(1 for n in gpu_nodes if n.state in ACTIVE)
    room = max(0, spec.unavailable_limit(len(gpu_nodes)) - active)
    steps: list[RemediationStep] = []
    for node in sorted(gpu_nodes, key=lambda n: (n.state != QUARANTINED, n.number(SINCE), n.name)):
        may_start = room > 0
        step = decide(node, spec, now, may_start)
        if step.state in ACTIVE and node.state not in ACTIVE:
            room -= 1
        if not step.empty:
            steps.append(step)
    busy = any(n.state in (QUARANTINED, *ACTIVE) for n in gpu_nodes) or any(
        s.state in (QUARANTINED, *ACTIVE) for s in steps
    )
    return RemediationPlan(tuple(steps), busy)


def release_all(nodes: Sequence[RemediationFacts], spec: RemediationSpec) -> RemediationPlan:
    """Remediation switched off: every node it holds goes back (uncordoned where we cordoned it),
    except one held by hand or for flapping (it waits for `health retry`)."""
    return RemediationPlan(tuple(_release(n, spec) for n in nodes if n.state and n.state != HELD), False)


def retry_patch(annotations: Mapping[str, str]) -> dict[str, Any]:
    """`gpu-operator health retry NODE`: back to quarantined, attempts and reason forgotten."""
    notes: dict[str, str | None] = {
        ATTEMPTS: None,
        REASON: None,
        STEP: None,
        ACTION: None,
        UNHEALTHY_AT: None,
        **CLEAR_REQUESTS,
    }
    return {"metadata": {"labels": {HEALTH_STATE: QUARANTINED}, "annotations": notes}}


def hold_patch(reason: str, now: float) -> dict[str, Any]:
    """`gpu-operator health hold NODE`: held (stays quarantined) until `health retry`."""
    return {
        "metadata": {
            "labels": {HEALTH_STATE: HELD},
            "annotations": {REASON: reason, SINCE: str(int(now)), **CLEAR_REQUESTS},
        }
    }
