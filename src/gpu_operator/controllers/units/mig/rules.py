"""Is a node's MIG change going, done, or stuck: pure decisions of the MIG unit (units/mig/unit.py).
Its restore order is one annotation (vocabulary.MIG_RESTORE), which node labelling reads.

NVIDIA's MIG manager (mig-parted v0.15.0) writes `nvidia.com/mig.config.state` and pauses the GPU
clients by setting their deploy labels to `paused-for-mig-change`; when the clients' pods do not
leave the node within its 5-minute wait it gives up and leaves the node `pending` and paused, and
its watch reacts only to a change of `nvidia.com/mig.config` or its own start
(cmd/nvidia-mig-manager/main.go), so nothing ever tries again. The rules here:

- in a change (state pending or rebooting, or a deploy label paused): in progress while the MIG
  manager's pod is on the node and the change is younger than the budget (the first time the
  operator saw it: our annotation, the MIG manager writes no time); past the budget, or with no
  MIG manager to finish it, the node is stuck;
- stuck: the operator orders its paused deploy labels restored (node labelling, their one writer,
  writes them back to `true`: the GPU clients come back on whatever layout the GPUs have), names
  why (the GPU client pods that did not stop, or none: a reset or reboot is required), and after a
  backoff restarts the node's MIG manager pod, whose start runs the change again;
- state failed (the MIG manager restored the labels itself): reported, retried the same way;
- a `mig.config` that is no config of the layouts ConfigMap: reported with the valid names, never
  retried (the MIG manager acts on the next change of the label itself).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpu_operator.controllers.settings import Backoff
from gpu_operator.vocabulary import (
    ALL_DEPLOY_LABELS,
    MIG_APPLIED,
    MIG_CONFIG_STATE,
    MIG_FAILED,
    MIG_IN_PROGRESS,
    MIG_INVALID_CONFIG,
    MIG_MANAGER_GONE,
    MIG_NOT_STARTED,
    MIG_PAUSED,
    MIG_PENDING_SINCE,
    MIG_RESTORE,
    MIG_RETRY,
    MIG_STUCK,
)

PENDING, REBOOTING, SUCCESS, FAILED = "pending", "rebooting", "success", "failed"
OURS = (MIG_PENDING_SINCE, MIG_RESTORE, MIG_RETRY)


class ManagerPresence(enum.Enum):
    """The node's MIG manager, as its pods and the node's deploy label say."""

    RUNNING = "running"  # a pod of it is on the node (not being deleted)
    GONE = "gone"  # none on the node, but the node is meant to run one (its DaemonSet brings it back)
    NOT_DEPLOYED = "not deployed"  # none, and none will come (deploy label not true, or disabled)


class Verdict(enum.Enum):
    NONE = "none"  # no MIG config on the node: no condition
    APPLIED = "applied"
    NOT_STARTED = "not started"
    IN_PROGRESS = "in progress"
    STUCK = "stuck"
    FAILED = "failed"
    INVALID = "invalid config"


@dataclass(frozen=True)
class MIGFacts:
    node: str
    config: str | None  # nvidia.com/mig.config
    state: str | None  # nvidia.com/mig.config.state
    paused: tuple[str, ...]  # our deploy labels at paused-for-mig-change
    manager: ManagerPresence
    pending_since: float | None = None
    pending_config: str | None = None  # the mig.config that pending-since was recorded for
    restore: str | None = None  # our restore order: "<condition reason> <why the node was stuck>"
    attempts: int = 0  # retries since the last success
    retry_from: float | None = None  # when the next retry's backoff counts from
    valid: tuple[str, ...] | None = None  # the layouts ConfigMap's config names; None: unknown
    layouts: str = ""  # that ConfigMap's name
    clients: tuple[str, ...] = ()  # GPU client pods still on the node (namespace/name)
    holders: tuple[str, ...] = ()  # other pods on the node given GPUs (namespace/name): they hold the GPUs

    @property
    def in_change(self) -> bool:
        return self.state in (PENDING, REBOOTING) or bool(self.paused)

    @property
    def invalid(self) -> bool:
        return self.config is not None and self.valid is not None and self.config not in self.valid


@dataclass(frozen=True)
class MIGDecision:
    kind: Verdict
    status: str = ""  # the condition's status: True | False | Unknown ('' with Verdict.NONE)
    reason: str = ""
    message: str = ""
    notes: dict[str, str | None] = field(default_factory=dict)  # our annotations to write (None: remove)
    retry: bool = False  # restart the node's MIG manager pod now
    wake: float | None = None  # when to look again without an event (epoch)

    @property
    def condition(self) -> tuple[str, str, str] | None:
        return (self.status, self.reason, self.message) if self.kind is not Verdict.NONE else None


def paused_labels(labels: Mapping[str, str]) -> tuple[str, ...]:
    """Our deploy labels the MIG manager holds at paused-for-mig-change."""
    return tuple(sorted(k for k in ALL_DEPLOY_LABELS if labels.get(k) == MIG_PAUSED))


def parse_retry(value: str | None) -> tuple[int, float | None]:
    """Our retry annotation, "<attempts> <epoch>"; anything else reads as no retry yet."""
    try:
        attempts, since = (value or "").split()
        return max(0, int(attempts)), float(since)
    except ValueError:
        return 0, None


def parse_since(value: str | None) -> tuple[float | None, str | None]:
    """Our pending-since annotation, "<epoch> <mig.config>"; anything else reads as not seen yet."""
    epoch, _, config = (value or "").partition(" ")
    try:
        return float(epoch), config
    except ValueError:
        return None, None


def _since(now: float, config: str | None) -> str:
    return f"{_epoch(now)} {config or ''}"


def _epoch(t: float) -> str:
    return str(int(t))


def needs_pods(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """Whether deciding needs the node's pods (its MIG manager, the GPU clients left)."""
    return (
        labels.get(MIG_CONFIG_STATE) in (PENDING, REBOOTING, FAILED)
        or bool(paused_labels(labels))
        or any(k in annotations for k in OURS)
    )


def stuck_message(f: MIGFacts, budget: float) -> tuple[str, str]:
    """(reason, message) of a node stuck in a change: the text of our restore order."""
    head = f"MIG config {f.config!r} {f.state or 'paused'} past the {int(budget)} s budget"
    if f.manager is ManagerPresence.NOT_DEPLOYED:
        return MIG_MANAGER_GONE, (
            f"{head}: no MIG manager will run on the node to finish it; its paused GPU clients are restored"
        )
    if f.manager is ManagerPresence.GONE:
        return (
            MIG_MANAGER_GONE,
            f"{head}: no MIG manager pod on the node; its paused GPU clients are restored",
        )
    if f.clients:
        return MIG_STUCK, (
            f"{head}: GPU clients that did not stop: {', '.join(f.clients)}; "
            "they are restored on the current layout and the change is retried"
        )
    return MIG_STUCK, (
        f"{head}: no GPU client pod is left on the node: reset or reboot required "
        "(a GPU reset that failed, or a process outside Kubernetes holding the GPUs); "
        "the paused GPU clients are restored and the change is retried"
    )


def failed_message(f: MIGFacts) -> str:
    """Why a change failed, as far as the operator can tell: pods holding the GPUs (the driver refuses
    to reset a GPU, or destroy an instance, a process uses), else the MIG manager's log says."""
    head = f"the MIG manager could not apply MIG config {f.config!r}"
    tail = "the GPU clients run on the previous layout and the change is retried"
    if f.holders:
        return (
            f"{head}: pods on the node hold its GPUs: {', '.join(f.holders)} (the driver refuses a GPU reset "
            f"or an instance's removal while a process uses it; the change completes once they are gone); {tail}"
        )
    return (
        f"{head}: a layout these GPUs refuse, or a MIG mode change that needs a GPU reset or reboot (reset or "
        f"reboot required; its log says which); {tail}"
    )


def decide(f: MIGFacts, now: float, budget: float, backoff: Backoff) -> MIGDecision:
    """What the node's MIG change is, and what to write about it."""
    if f.config is None and f.state is None and not f.paused:
        return MIGDecision(Verdict.NONE, notes=_clear(f))
    if f.in_change:
        if f.pending_since is not None and f.pending_config != (f.config or ""):
            # mig.config changed since: a new change (the MIG manager runs it), with its own budget; the
            # old change's order and retries go, or node labelling would undo the new change's pause
            dropped = {
                k: None for k, v in ((MIG_RESTORE, f.restore), (MIG_RETRY, f.retry_from)) if v is not None
            }
            d = decide(
                replace(f, pending_since=None, restore=None, attempts=0, retry_from=None),
                now,
                budget,
                backoff,
            )
            return replace(d, notes={**dropped, **d.notes})
        since = f.pending_since if f.pending_since is not None else now
        notes: dict[str, str | None] = (
            {} if f.pending_since is not None else {MIG_PENDING_SINCE: _since(now, f.config)}
        )
        age = now - since
        if f.manager is not ManagerPresence.NOT_DEPLOYED and age < budget:
            if f.restore is not None:
                notes[MIG_RESTORE] = None
            return MIGDecision(
                Verdict.IN_PROGRESS,
                "False",
                MIG_IN_PROGRESS,
                f"applying MIG config {f.config!r}: state {f.state or 'unset'}, GPU clients paused",
                notes,
                wake=since + budget,
            )
        if f.restore is not None:
            reason, _, message = f.restore.partition(" ")
        else:
            reason, message = stuck_message(f, budget)
            notes[MIG_RESTORE] = f"{reason} {message}"
        return _retry(MIGDecision(Verdict.STUCK, "False", reason, message, notes), f, now, backoff)
    if f.invalid:
        names = ", ".join(f.valid or ())
        return MIGDecision(
            Verdict.INVALID,
            "False",
            MIG_INVALID_CONFIG,
            f"nvidia.com/mig.config {f.config!r} is not a config of ConfigMap {f.layouts}; "
            f"valid names: {names}",
            _clear(f),
        )
    if f.state == SUCCESS:
        return MIGDecision(
            Verdict.APPLIED, "True", MIG_APPLIED, f"MIG config {f.config!r} applied", _clear(f)
        )
    if f.state == FAILED:
        notes = {
            k: None
            for k in (MIG_PENDING_SINCE, MIG_RESTORE)
            if (f.pending_since if k == MIG_PENDING_SINCE else f.restore) is not None
        }
        return _retry(
            MIGDecision(Verdict.FAILED, "False", MIG_FAILED, failed_message(f), notes), f, now, backoff
        )
    return MIGDecision(
        Verdict.NOT_STARTED,
        "Unknown",
        MIG_NOT_STARTED,
        f"MIG config {f.config!r} not yet acted on by the MIG manager (state {f.state or 'unset'})",
        _clear(f),
    )


def hold_stale_success(
    d: MIGDecision,
    config: str | None,
    applied: str | None,
    held: tuple[str, float] | None,
    now: float,
    poll: float,
) -> tuple[str, float] | None:
    """A node whose `mig.config` changed while its state still says `success` of the config applied
    before (`applied`: the unit saw it so): the MIG manager writes `pending` once it acts, or
    `success` again where the new config is already applied (the same value: no event). Until
    `poll` seconds have passed the unit holds its condition as it is, rather than write "applied"
    now and "in progress" a moment later. Returns (config, since) while holding, None to go on."""
    if d.kind is not Verdict.APPLIED or applied is None or applied == config or config is None:
        return None
    since = held[1] if held is not None and held[0] == config else now
    return (config, since) if now < since + poll else None


def _clear(f: MIGFacts) -> dict[str, str | None]:
    present = {MIG_PENDING_SINCE: f.pending_since, MIG_RESTORE: f.restore, MIG_RETRY: f.retry_from}
    return {k: None for k, v in present.items() if v is not None}


def _retry(d: MIGDecision, f: MIGFacts, now: float, backoff: Backoff) -> MIGDecision:
    """A stuck or failed node: once its GPU clients are restored and the backoff has passed, its
    MIG manager pod is restarted (its start runs the change again); never while labels are paused."""
    notes = dict(d.notes)
    start = f.retry_from
    if start is None:
        start = now
        notes[MIG_RETRY] = f"{f.attempts} {_epoch(now)}"
    due = start + backoff.delay(f.attempts + 1)
    if f.paused or f.manager is not ManagerPresence.RUNNING:
        # node labelling restores the labels (an event follows); a MIG manager that comes back runs
        # the change at its start; one that will not come cannot be retried
        return MIGDecision(d.kind, d.status, d.reason, d.message, notes, wake=None)
    if now < due:
        return MIGDecision(d.kind, d.status, d.reason, d.message, notes, wake=due)
    notes.update({MIG_RETRY: f"{f.attempts + 1} {_epoch(now)}", MIG_RESTORE: None, MIG_PENDING_SINCE: None})
    notes = {k: v for k, v in notes.items() if v is not None or k == MIG_RETRY or _present(f, k)}
    return MIGDecision(d.kind, d.status, d.reason, d.message, notes, retry=True)


def _present(f: MIGFacts, key: str) -> bool:
    return (f.restore if key == MIG_RESTORE else f.pending_since) is not None
