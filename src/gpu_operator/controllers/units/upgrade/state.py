"""The driver upgrade state machine, pure: node facts + policy + now -> per node the next state
and the actions to take. No I/O; controllers/units/upgrade/controller.py gathers the facts and carries out the steps.

Called once per owner of driver pods (the ClusterPolicy, or each NVIDIADriver with its own
upgradePolicy): `plan(nodes, policy, now, paused)` where `nodes` are the nodes that owner's
driver DaemonSet(s) run on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from gpu_operator.controllers import drain as node_drain
from gpu_operator.controllers.drain import PodFacts as PodFacts  # the pods' facts, the drain's
from gpu_operator.controllers.units.upgrade.facts import (  # what the machine reads (re-exported)
    VALIDATION_TIMEOUT_SECONDS as VALIDATION_TIMEOUT_SECONDS,
)
from gpu_operator.controllers.units.upgrade.facts import DriverPod as DriverPod
from gpu_operator.controllers.units.upgrade.facts import Policy as Policy
from gpu_operator.controllers.units.upgrade.facts import UpgradeNodeFacts as UpgradeNodeFacts
from gpu_operator.controllers.units.upgrade.facts import latest_revision_hash as latest_revision_hash
from gpu_operator.vocabulary import (
    CORDON_REQUIRED as CORDON_REQUIRED,
)
from gpu_operator.vocabulary import (
    DRAIN_REQUIRED as DRAIN_REQUIRED,
)
from gpu_operator.vocabulary import (
    HEALTH_STATE,
    UPGRADE_ACTIVE,
    UPGRADE_DRAIN_START_ANNOTATION,
    UPGRADE_FAILURE_REASON_ANNOTATION,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_POD_DELETION_START_ANNOTATION,
    UPGRADE_REQUESTED_ANNOTATION,
    UPGRADE_STATE,
    UPGRADE_STATE_SINCE_ANNOTATION,
    UPGRADE_VALIDATION_START_ANNOTATION,
    UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION,
    UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION,
)
from gpu_operator.vocabulary import (
    POD_DELETION_REQUIRED as POD_DELETION_REQUIRED,
)
from gpu_operator.vocabulary import (
    POD_RESTART_REQUIRED as POD_RESTART_REQUIRED,
)
from gpu_operator.vocabulary import (
    UNCORDON_REQUIRED as UNCORDON_REQUIRED,
)
from gpu_operator.vocabulary import (  # the state names, shared with statusview and nodelabels
    UNKNOWN as UNKNOWN,
)
from gpu_operator.vocabulary import (
    UPGRADE_DONE as UPGRADE_DONE,
)
from gpu_operator.vocabulary import (
    UPGRADE_FAILED as UPGRADE_FAILED,
)
from gpu_operator.vocabulary import (
    UPGRADE_REQUIRED as UPGRADE_REQUIRED,
)
from gpu_operator.vocabulary import (
    VALIDATION_REQUIRED as VALIDATION_REQUIRED,
)
from gpu_operator.vocabulary import (
    WAIT_FOR_JOBS_REQUIRED as WAIT_FOR_JOBS_REQUIRED,
)

ACTIVE = UPGRADE_ACTIVE  # between cordon-required and uncordon-required: what maxParallelUpgrades bounds
# The GPU health remediation states that hold a node's cordon (controllers/units/health/machine.py's ACTIVE).
HEALTH_REMEDIATING = ("draining", "acting", "validating")
CRASH_LOOP_RESTARTS = 10  # upstream: any driver container restarted more than this -> failed


@dataclass(frozen=True)
class UpgradeStep:
    """What to do for one node this pass. `state` None: label unchanged."""

    node: str
    state: str | None = None
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    cordon: bool | None = None  # True cordon, False uncordon
    evict: tuple[PodFacts, ...] = ()
    delete_driver_pod: bool = False
    remove_state: bool = False
    message: str = ""
    warning: bool = False

    @property
    def empty(self) -> bool:
        return (
            self.state is None
            and not self.annotations
            and self.cordon is None
            and not self.evict
            and not self.delete_driver_pod
            and not self.remove_state
        )


@dataclass(frozen=True)
class Counts:
    total: int = 0
    in_progress: int = 0
    done: int = 0
    failed: int = 0
    pending: int = 0
    available: int = 0


def total(counts: Iterable[Counts]) -> Counts:
    """The sum of several owners' counts (the gauges are cluster-wide)."""
    items = list(counts)
    return Counts(*(sum(getattr(c, f.name) for c in items) for f in fields(Counts)))


@dataclass(frozen=True)
class UpgradePlan:
    steps: tuple[UpgradeStep, ...]
    counts: Counts


def _needs_upgrade(node: UpgradeNodeFacts) -> bool:
    d = node.driver
    return (
        (d is not None and (not d.in_sync or d.orphaned))
        or node.annotations.get(UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION) == "true"
        or node.annotations.get(UPGRADE_REQUESTED_ANNOTATION) == "true"
    )


def _to(
    node: UpgradeNodeFacts,
    state: str,
    now: float,
    message: str = "",
    *,
    warning: bool = False,
    annotations: Mapping[str, str | None] | None = None,
    **kw: Any,
) -> UpgradeStep:
    notes: dict[str, str | None] = {UPGRADE_STATE_SINCE_ANNOTATION: str(int(now))}
    if annotations:
        notes.update(annotations)
    return UpgradeStep(
        node.name,
        state=state,
        annotations=notes,
        message=message or f"Successfully updated node state label to {state}",
        warning=warning,
        **kw,
    )


def _fail(node: UpgradeNodeFacts, now: float, reason: str) -> UpgradeStep:
    return _to(
        node,
        UPGRADE_FAILED,
        now,
        f"upgrade failed: {reason}",
        warning=True,
        annotations={
            UPGRADE_FAILURE_REASON_ANNOTATION: reason,
            UPGRADE_POD_DELETION_START_ANNOTATION: None,
            UPGRADE_DRAIN_START_ANNOTATION: None,
            UPGRADE_VALIDATION_START_ANNOTATION: None,
            UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION: None,
        },
    )


def _after_upgrade(node: UpgradeNodeFacts, now: float) -> UpgradeStep:
    """Validated (or recovered): uncordon, unless the node was cordoned before the upgrade."""
    clear = {UPGRADE_VALIDATION_START_ANNOTATION: None, UPGRADE_FAILURE_REASON_ANNOTATION: None}
    if node.annotations.get(UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION) == "true":
        return _to(
            node, UPGRADE_DONE, now, annotations={**clear, UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: None}
        )
    return _to(
        node,
        UNCORDON_REQUIRED,
        now,
        annotations={**clear, UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: None}
        if UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION in node.annotations
        else clear,
    )


def _evicting(
    node: UpgradeNodeFacts,
    pods: Sequence[PodFacts],
    start_key: str,
    timeout: int,
    now: float,
    force: bool,
    empty_dir: bool,
    what: str,
) -> tuple[str, UpgradeStep | None]:
    """Pod deletion and drain through the shared drain (controllers/drain.py), its start time in
    the node's `start_key` annotation: ('done'|'failed:<reason>'|'wait', step)."""
    d = node_drain.decide(pods, node.ts(start_key), timeout, now, force=force, empty_dir=empty_dir, what=what)
    if d.outcome == node_drain.DONE:
        return "done", None
    if d.outcome == node_drain.FAILED:
        return f"failed:{d.reason}", None
    notes: dict[str, str | None] = {start_key: d.start} if d.start is not None else {}
    return "wait", UpgradeStep(node.name, annotations=notes, evict=d.evict, message=d.message)


def decide(node: UpgradeNodeFacts, policy: Policy, now: float, may_start: bool) -> UpgradeStep:
    """One node's next step. `may_start`: a slot is free for this node to leave upgrade-required."""
    state, d = node.state, node.driver
    if state in (UNKNOWN, UPGRADE_DONE):
        if d is None and state == UNKNOWN:
            return UpgradeStep(node.name)
        if _needs_upgrade(node):
            return _to(node, UPGRADE_REQUIRED, now)
        if state == UNKNOWN:
            return _to(node, UPGRADE_DONE, now)
        return UpgradeStep(node.name)
    if state == UPGRADE_REQUIRED:
        if node.skip or not may_start:
            return UpgradeStep(node.name)
        requested = UPGRADE_REQUESTED_ANNOTATION in node.annotations
        safe_load = node.annotations.get(UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION) == "true"
        notes: dict[str, str | None] = {}
        if node.unschedulable and UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION not in node.annotations:
            # ("false" is written by `upgrade retry` for a node this operator cordoned itself)
            notes[UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION] = "true"
        if requested:
            notes[UPGRADE_REQUESTED_ANNOTATION] = None
        if d is not None and d.restart_only and not d.orphaned and not requested and not safe_load:
            return _to(
                node,
                POD_RESTART_REQUIRED,
                now,
                "driver configuration unchanged: restarting the pod only",
                annotations=notes,
                cordon=True,
            )
        return _to(node, CORDON_REQUIRED, now, annotations=notes)
    if state == CORDON_REQUIRED:
        return _to(node, WAIT_FOR_JOBS_REQUIRED, now, cordon=True)
    if state == WAIT_FOR_JOBS_REQUIRED:
        return _wait_for_jobs(node, policy, now)
    if state == POD_DELETION_REQUIRED:
        # DaemonSet pods never (NVIDIA's pod deletion ignores them too): the operands run under the
        # nvidia RuntimeClass, and their DaemonSet would put them back on the cordoned node
        gpu_pods = [
            p
            for p in node.pods
            if p.gpu and p.phase in ("Running", "Pending") and not p.mirror and not p.daemonset
        ]
        outcome, step = _evicting(
            node,
            gpu_pods,
            UPGRADE_POD_DELETION_START_ANNOTATION,
            policy.deletion_timeout,
            now,
            policy.deletion_force,
            policy.deletion_empty_dir,
            "GPU pod deletion",
        )
        clear = {UPGRADE_POD_DELETION_START_ANNOTATION: None}
        if outcome == "done":
            nxt = DRAIN_REQUIRED if policy.drain_enable else POD_RESTART_REQUIRED
            return _to(
                node, nxt, now, "Deleted workload pods on the node for the driver upgrade", annotations=clear
            )
        if outcome.startswith("failed:"):
            if policy.drain_enable:
                return _to(
                    node,
                    DRAIN_REQUIRED,
                    now,
                    "Pod deletion failed but drain is enabled in spec. "
                    f"Will attempt a node drain ({outcome[7:]})",
                    warning=True,
                    annotations=clear,
                )
            return _fail(node, now, outcome[7:])
        return step or UpgradeStep(node.name)
    if state == DRAIN_REQUIRED:
        if not policy.drain_enable:
            return _to(node, POD_RESTART_REQUIRED, now)
        pods = [
            p
            for p in node.pods
            if not p.daemonset
            and not p.mirror
            and not p.drain_skip
            and p.drain_match
            and p.phase in ("Running", "Pending")
        ]
        outcome, step = _evicting(
            node,
            pods,
            UPGRADE_DRAIN_START_ANNOTATION,
            policy.drain_timeout,
            now,
            policy.drain_force,
            policy.drain_empty_dir,
            "drain",
        )
        if outcome == "done":
            return _to(
                node,
                POD_RESTART_REQUIRED,
                now,
                "Successfully drained the node",
                annotations={UPGRADE_DRAIN_START_ANNOTATION: None},
            )
        if outcome.startswith("failed:"):
            return _fail(node, now, outcome[7:])
        return step or UpgradeStep(node.name)
    if state == POD_RESTART_REQUIRED:
        return _pod_restart(node, now)
    if state == VALIDATION_REQUIRED:
        if node.validators_ready:
            return _after_upgrade(node, now)
        started = node.ts(UPGRADE_VALIDATION_START_ANNOTATION)
        if started is None:
            return UpgradeStep(node.name, annotations={UPGRADE_VALIDATION_START_ANNOTATION: str(int(now))})
        if now - started > policy.validation_timeout:
            what = (
                "no validator pod on the node"
                if node.validators_ready is None
                else "validator pods not ready"
            )
            return _fail(node, now, f"validation timed out after {policy.validation_timeout}s ({what})")
        return UpgradeStep(node.name)
    if state == UNCORDON_REQUIRED:
        return _to(node, UPGRADE_DONE, now, cordon=False)
    if state == UPGRADE_FAILED:
        if d is not None and d.in_sync and not d.orphaned and d.ready and not _needs_upgrade(node):
            return _after_upgrade(node, now)
        return UpgradeStep(node.name)
    return UpgradeStep(
        node.name, message=f"could not determine next upgrade state from {state!r}, will retry", warning=True
    )


def _wait_for_jobs(node: UpgradeNodeFacts, policy: Policy, now: float) -> UpgradeStep:
    clear = {UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION: None}
    if not policy.wait_selector:
        return _to(node, POD_DELETION_REQUIRED, now, annotations=clear)
    running = [p for p in node.pods if p.wait_match and p.phase in ("Running", "Pending")]
    if not running:
        return _to(node, POD_DELETION_REQUIRED, now, annotations=clear)
    if policy.wait_timeout > 0:
        started = node.ts(UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION)
        if started is None:
            return UpgradeStep(
                node.name, annotations={UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION: str(int(now))}
            )
        if now - started > policy.wait_timeout:
            return _to(node, POD_DELETION_REQUIRED, now, "waitForCompletion timed out", annotations=clear)
    return UpgradeStep(node.name)


def _pod_restart(node: UpgradeNodeFacts, now: float) -> UpgradeStep:
    d = node.driver
    if d is None or d.terminating:
        return UpgradeStep(node.name)  # the DaemonSet controller is replacing it
    if not d.in_sync or d.orphaned:
        return UpgradeStep(
            node.name, delete_driver_pod=True, message=f"Restarting driver pod {d.namespace}/{d.name}"
        )
    notes: dict[str, str | None] = {}
    if UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION in node.annotations:
        notes[UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION] = None  # unblock the driver's safe load
    if d.ready:
        return _to(node, VALIDATION_REQUIRED, now, annotations=notes)
    if d.restarts > CRASH_LOOP_RESTARTS:
        return _fail(node, now, f"driver pod {d.namespace}/{d.name} crash-looping ({d.restarts} restarts)")
    return UpgradeStep(node.name, annotations=notes)


def plan(nodes: Sequence[UpgradeNodeFacts], policy: Policy, now: float, paused: bool = False) -> UpgradePlan:
    """Every node's step this pass; slots and maxUnavailable bound who leaves upgrade-required."""
    if not policy.auto_upgrade:
        return UpgradePlan(
            tuple(
                UpgradeStep(n.name, remove_state=True, message="driver auto-upgrade disabled")
                for n in nodes
                if n.state != UNKNOWN
            ),
            Counts(),
        )
    managed = [n for n in nodes if n.driver is not None or n.state != UNKNOWN]
    total = len(managed)
    by_state: dict[str, int] = {}
    for n in managed:
        by_state[n.state] = by_state.get(n.state, 0) + 1
    in_progress = (
        total - by_state.get(UNKNOWN, 0) - by_state.get(UPGRADE_DONE, 0) - by_state.get(UPGRADE_REQUIRED, 0)
    )
    # maxParallelUpgrades bounds every node that starts; maxUnavailable only those that are not
    # cordoned already (a cordoned node adds no unavailability).
    parallel = total if policy.max_parallel == 0 else max(0, policy.max_parallel - in_progress)
    limit = policy.unavailable_limit(total)
    unavailable = sum(1 for n in managed if n.unschedulable or not n.ready or n.state == CORDON_REQUIRED)
    room = max(0, limit - unavailable)
    if paused:
        parallel = 0
    steps: list[UpgradeStep] = []
    # one owner of a node's cordon at a time: a node in GPU health remediation waits for it to end
    waiting = sorted(
        (
            n
            for n in managed
            if n.state == UPGRADE_REQUIRED
            and not n.skip
            and n.labels.get(HEALTH_STATE) not in HEALTH_REMEDIATING
        ),
        key=lambda n: (not n.unschedulable, n.name),
    )
    starting: set[str] = set()
    for node in waiting:
        if parallel <= 0:
            break
        if node.unschedulable:
            starting.add(node.name)
            parallel -= 1
        elif room > 0:
            starting.add(node.name)
            parallel, room = parallel - 1, room - 1
    slots = min(parallel, room)
    for node in sorted(managed, key=lambda n: n.name):
        may_start = node.name in starting
        step = decide(node, policy, now, may_start)
        if not step.empty:
            steps.append(step)
    counts = Counts(
        total=total,
        in_progress=in_progress,
        done=by_state.get(UPGRADE_DONE, 0),
        failed=by_state.get(UPGRADE_FAILED, 0),
        pending=by_state.get(UPGRADE_REQUIRED, 0),
        available=max(0, slots),
    )
    return UpgradePlan(tuple(steps), counts)


def retry_patch(annotations: Mapping[str, str]) -> dict[str, Any]:
    """`gpu-operator upgrade retry NODE`: back to upgrade-required, the failure forgotten. A node
    we cordoned ourselves is marked initially schedulable so that it is uncordoned at the end."""
    notes: dict[str, str | None] = {
        UPGRADE_FAILURE_REASON_ANNOTATION: None,
        UPGRADE_POD_DELETION_START_ANNOTATION: None,
        UPGRADE_DRAIN_START_ANNOTATION: None,
        UPGRADE_VALIDATION_START_ANNOTATION: None,
        UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION: None,
    }
    if annotations.get(UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION) != "true":
        notes[UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION] = "false"
    return {"metadata": {"labels": {UPGRADE_STATE: UPGRADE_REQUIRED}, "annotations": notes}}
