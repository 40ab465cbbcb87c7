"""controllers/units/mig/rules.py: the verdict on a node's MIG change, table by table (in progress, stuck
past the budget, MIG manager gone, failed, invalid config, applied), the restore order and the
retries with their backoff, never while a change is in progress or labels are paused."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.units.mig import rules as mr
from gpu_operator.vocabulary import (
    MIG_APPLIED,
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
    deploy_label,
)

BUDGET = 600.0
BACKOFF = Backoff(initial=60.0, cap=1800.0)
NOW = 10_000.0
DP = deploy_label("device-plugin")
GFD = deploy_label("gpu-feature-discovery")
R = mr.ManagerPresence.RUNNING


def facts(**kw: object) -> mr.MIGFacts:
    base: dict[str, object] = {
        "node": "n1",
        "config": "all-1g.10gb",
        "state": None,
        "paused": (),
        "manager": R,
    }
    base.update(kw)
    if base.get("pending_since") is not None and "pending_config" not in kw:
        base["pending_config"] = base["config"] or ""  # recorded for the same config
    return mr.MIGFacts(**base)  # type: ignore[arg-type]


def decide(f: mr.MIGFacts, now: float = NOW) -> mr.MIGDecision:
    return mr.decide(f, now, BUDGET, BACKOFF)


# (case, facts, kind, condition status, reason)
VERDICTS = [
    ("no MIG config", facts(config=None), mr.Verdict.NONE, "", ""),
    ("applied", facts(state="success"), mr.Verdict.APPLIED, "True", MIG_APPLIED),
    ("not yet acted on", facts(), mr.Verdict.NOT_STARTED, "Unknown", MIG_NOT_STARTED),
    (
        "pending, first seen now",
        facts(state="pending", paused=(DP,)),
        mr.Verdict.IN_PROGRESS,
        "False",
        MIG_IN_PROGRESS,
    ),
    (
        "pending within budget",
        facts(state="pending", paused=(DP,), pending_since=NOW - 599),
        mr.Verdict.IN_PROGRESS,
        "False",
        MIG_IN_PROGRESS,
    ),
    (
        "pending past budget",
        facts(state="pending", paused=(DP,), pending_since=NOW - 600),
        mr.Verdict.STUCK,
        "False",
        MIG_STUCK,
    ),
    (
        "rebooting past budget",
        facts(state="rebooting", pending_since=NOW - 601),
        mr.Verdict.STUCK,
        "False",
        MIG_STUCK,
    ),
    (
        "paused, no state, past budget",
        facts(paused=(DP,), pending_since=NOW - 700),
        mr.Verdict.STUCK,
        "False",
        MIG_STUCK,
    ),
    (
        "manager pod gone within budget: wait for the DaemonSet's",
        facts(state="pending", paused=(DP,), pending_since=NOW - 10, manager=mr.ManagerPresence.GONE),
        mr.Verdict.IN_PROGRESS,
        "False",
        MIG_IN_PROGRESS,
    ),
    (
        "manager pod gone past budget",
        facts(state="pending", paused=(DP,), pending_since=NOW - 700, manager=mr.ManagerPresence.GONE),
        mr.Verdict.STUCK,
        "False",
        MIG_MANAGER_GONE,
    ),
    (
        "no MIG manager will come: at once",
        facts(state="pending", paused=(DP,), manager=mr.ManagerPresence.NOT_DEPLOYED),
        mr.Verdict.STUCK,
        "False",
        MIG_MANAGER_GONE,
    ),
    (
        "failed",
        facts(state="failed", valid=("all-1g.10gb", "all-disabled")),
        mr.Verdict.FAILED,
        "False",
        MIG_FAILED,
    ),
    (
        "failed, config unknown to the ConfigMap",
        facts(state="failed", config="nope", valid=("b", "a")),
        mr.Verdict.INVALID,
        "False",
        MIG_INVALID_CONFIG,
    ),
    (
        "invalid before the MIG manager acted",
        facts(config="nope", valid=("a",)),
        mr.Verdict.INVALID,
        "False",
        MIG_INVALID_CONFIG,
    ),
    (
        "names unknown: never called invalid",
        facts(state="failed", config="nope", valid=None),
        mr.Verdict.FAILED,
        "False",
        MIG_FAILED,
    ),
    (
        "an invalid config while a change is pending: the change rules",
        facts(state="pending", config="nope", valid=("a",), pending_since=NOW - 5),
        mr.Verdict.IN_PROGRESS,
        "False",
        MIG_IN_PROGRESS,
    ),
]


@pytest.mark.parametrize(("case", "f", "kind", "status", "reason"), VERDICTS, ids=[v[0] for v in VERDICTS])
def test_verdicts(case: str, f: mr.MIGFacts, kind: mr.Verdict, status: str, reason: str) -> None:
    d = decide(f)
    assert (d.kind, d.status, d.reason) == (kind, status, reason)


def test_pending_first_seen_is_recorded_and_the_budget_is_the_wake() -> None:
    d = decide(facts(state="pending", paused=(DP,)))
    assert d.notes == {MIG_PENDING_SINCE: f"{int(NOW)} all-1g.10gb"}
    assert d.wake == NOW + BUDGET and not d.retry
    again = decide(facts(state="pending", paused=(DP,), pending_since=NOW - 100))
    assert again.notes == {} and again.wake == NOW - 100 + BUDGET


def test_stuck_names_the_clients_that_did_not_stop_and_orders_the_restore() -> None:
    f = facts(
        state="pending",
        paused=(DP, GFD),
        pending_since=NOW - 700,
        clients=("gpu-operator/nvidia-dcgm-x", "gpu-operator/nvidia-device-plugin-daemonset-y"),
    )
    d = decide(f)
    expected = (
        "MIG config 'all-1g.10gb' pending past the 600 s budget: GPU clients that did not stop: "
        "gpu-operator/nvidia-dcgm-x, gpu-operator/nvidia-device-plugin-daemonset-y; they are restored "
        "on the current layout and the change is retried"
    )
    assert d.message == expected
    assert d.notes == {MIG_RESTORE: f"{MIG_STUCK} {expected}", MIG_RETRY: f"0 {int(NOW)}"}
    assert not d.retry and d.wake is None  # labels still paused: node labelling restores them first


def test_stuck_with_no_client_left_says_reset_or_reboot() -> None:
    d = decide(facts(state="pending", paused=(DP,), pending_since=NOW - 700))
    assert d.message == (
        "MIG config 'all-1g.10gb' pending past the 600 s budget: no GPU client pod is left on the node: reset or "
        "reboot required (a GPU reset that failed, or a process outside Kubernetes holding the GPUs); the paused "
        "GPU clients are restored and the change is retried"
    )


def test_the_restore_order_text_is_kept_so_the_condition_does_not_move() -> None:
    order = f"{MIG_STUCK} the reason written when it was found"
    f = facts(
        state="pending", paused=(), pending_since=NOW - 700, restore=order, attempts=0, retry_from=NOW - 10
    )
    d = decide(f)
    assert (d.reason, d.message) == (MIG_STUCK, "the reason written when it was found")
    assert d.notes == {} and not d.retry and d.wake == NOW - 10 + 60


def test_retry_once_labels_are_back_and_the_backoff_passed() -> None:
    order = f"{MIG_STUCK} why"
    f = facts(state="pending", pending_since=NOW - 700, restore=order, attempts=0, retry_from=NOW - 60)
    d = decide(f)
    assert d.retry
    assert d.notes == {MIG_RETRY: f"1 {int(NOW)}", MIG_RESTORE: None, MIG_PENDING_SINCE: None}
    # the next one waits twice as long, counted from this retry
    second = decide(dataclasses.replace(f, attempts=1, retry_from=NOW), now=NOW + 119)
    assert not second.retry and second.wake == NOW + 120
    assert decide(dataclasses.replace(f, attempts=1, retry_from=NOW), now=NOW + 120).retry


@pytest.mark.parametrize("blocker", ["paused labels", "manager gone", "manager not deployed"])
def test_never_retried_while_labels_are_paused_or_no_manager_runs(blocker: str) -> None:
    f = facts(
        state="pending",
        pending_since=NOW - 7000,
        restore=f"{MIG_STUCK} why",
        retry_from=NOW - 7000,
        paused=(DP,) if blocker == "paused labels" else (),
        manager={
            "manager gone": mr.ManagerPresence.GONE,
            "manager not deployed": mr.ManagerPresence.NOT_DEPLOYED,
        }.get(blocker, R),
    )
    assert not decide(f).retry


def test_never_retried_while_a_change_is_in_progress() -> None:
    f = facts(state="pending", paused=(DP,), pending_since=NOW - 10, retry_from=NOW - 7000, attempts=3)
    d = decide(f)
    assert d.kind is mr.Verdict.IN_PROGRESS and not d.retry
    # a stale restore order goes once a new change runs (the retry's), so node labelling keeps the pause
    d = decide(dataclasses.replace(f, restore=f"{MIG_STUCK} old"))
    assert d.notes == {MIG_RESTORE: None}


def test_a_new_mig_config_while_stuck_is_a_new_change_with_its_own_budget() -> None:
    f = facts(
        state="pending",
        paused=(DP,),
        config="all-3g.40gb",
        pending_since=NOW - 9000,
        pending_config="all-1g.10gb",
        restore=f"{MIG_STUCK} old",
        attempts=2,
        retry_from=NOW - 100,
    )
    d = decide(f)
    assert d.kind is mr.Verdict.IN_PROGRESS and not d.retry
    # the old order goes (node labelling keeps the new pause), the retries start over
    assert d.notes == {MIG_RESTORE: None, MIG_RETRY: None, MIG_PENDING_SINCE: f"{int(NOW)} all-3g.40gb"}
    assert mr.parse_since(f"{int(NOW)} all-3g.40gb") == (NOW, "all-3g.40gb")
    assert mr.parse_since("garbage") == (None, None) and mr.parse_since(None) == (None, None)


def test_failed_is_retried_with_backoff_and_success_forgets_everything() -> None:
    f = facts(state="failed", valid=("all-1g.10gb",))
    first = decide(f)
    assert first.notes == {MIG_RETRY: f"0 {int(NOW)}"} and first.wake == NOW + 60 and not first.retry
    due = decide(dataclasses.replace(f, retry_from=NOW - 60))
    assert due.retry and due.notes == {MIG_RETRY: f"1 {int(NOW)}"}
    done = decide(facts(state="success", attempts=2, retry_from=NOW, pending_since=NOW))
    assert done.notes == {MIG_RETRY: None, MIG_PENDING_SINCE: None}


def test_invalid_config_names_the_valid_ones_and_is_never_retried() -> None:
    d = decide(
        facts(
            state="failed",
            config="all-3g.40gbx",
            valid=("all-1g.10gb", "all-disabled"),
            layouts="default-mig-parted-config",
            retry_from=NOW - 9999,
        )
    )
    assert d.message == (
        "nvidia.com/mig.config 'all-3g.40gbx' is not a config of ConfigMap "
        "default-mig-parted-config; valid names: all-1g.10gb, all-disabled"
    )
    assert not d.retry and d.notes == {MIG_RETRY: None}


def test_paused_labels() -> None:
    labels = {DP: MIG_PAUSED, GFD: "true", deploy_label("dcgm"): MIG_PAUSED, "other": MIG_PAUSED}
    assert mr.paused_labels(labels) == (deploy_label("dcgm"), DP)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("2 1700", (2, 1700.0)), ("", (0, None)), (None, (0, None)), ("x y", (0, None)), ("3", (0, None))],
)
def test_parse_retry(value: str | None, parsed: tuple[int, float | None]) -> None:
    assert mr.parse_retry(value) == parsed


def test_failed_with_pods_holding_the_gpus_names_them() -> None:
    d = decide(facts(state="failed", valid=("all-1g.10gb",), holders=("team-a/train-0", "team-b/infer-1")))
    assert (d.kind, d.reason) == (mr.Verdict.FAILED, MIG_FAILED)
    assert d.message == (
        "the MIG manager could not apply MIG config 'all-1g.10gb': pods on the node hold its GPUs: team-a/train-0, "
        "team-b/infer-1 (the driver refuses a GPU reset or an instance's removal while a process uses it; the change "
        "completes once they are gone); the GPU clients run on the previous layout and the change is retried"
    )
