"""The driver upgrade state machine, state by state (pure: no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.common import DriverUpgradePolicySpec
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.vocabulary import (
    UPGRADE_DRAIN_START_ANNOTATION,
    UPGRADE_FAILURE_REASON_ANNOTATION,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_POD_DELETION_START_ANNOTATION,
    UPGRADE_REQUESTED_ANNOTATION,
    UPGRADE_SKIP,
    UPGRADE_STATE,
    UPGRADE_VALIDATION_START_ANNOTATION,
    UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION,
    UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION,
)

NOW = 10_000.0
OLD = us.DriverPod("drv-old", "gpu-operator", in_sync=False, ready=True)
NEW = us.DriverPod("drv-new", "gpu-operator", in_sync=True, ready=True)
ON = us.Policy(auto_upgrade=True, max_parallel=0, max_unavailable="100%")


def node(
    state: str = "",
    driver: us.DriverPod | None = NEW,
    *,
    name: str = "n1",
    skip: bool = False,
    annotations: dict[str, str] | None = None,
    **kw: Any,
) -> us.UpgradeNodeFacts:
    labels = {UPGRADE_STATE: state} if state else {}
    if skip:
        labels[UPGRADE_SKIP] = "true"
    return us.UpgradeNodeFacts(name, labels=labels, annotations=annotations or {}, driver=driver, **kw)


def gpu_pod(name: str = "w", **kw: Any) -> us.PodFacts:
    return us.PodFacts(name, "work", gpu=True, **kw)


@pytest.mark.parametrize(
    ("facts", "policy", "may_start", "want"),
    [
        # unknown / done: decide from the driver pod's revision and the annotations
        (node("", NEW), ON, False, us.UPGRADE_DONE),
        (node("", OLD), ON, False, us.UPGRADE_REQUIRED),
        (node(us.UPGRADE_DONE, OLD), ON, False, us.UPGRADE_REQUIRED),
        (node(us.UPGRADE_DONE, NEW), ON, False, None),
        (
            node(us.UPGRADE_DONE, us.DriverPod("d", "ns", in_sync=True, orphaned=True)),
            ON,
            False,
            us.UPGRADE_REQUIRED,
        ),
        (
            node(us.UPGRADE_DONE, NEW, annotations={UPGRADE_REQUESTED_ANNOTATION: "true"}),
            ON,
            False,
            us.UPGRADE_REQUIRED,
        ),
        (
            node(us.UPGRADE_DONE, NEW, annotations={UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION: "true"}),
            ON,
            False,
            us.UPGRADE_REQUIRED,
        ),
        (node("", None), ON, False, None),  # no driver pod: not managed
        # upgrade-required: needs a slot, skip label holds it
        (node(us.UPGRADE_REQUIRED, OLD), ON, True, us.CORDON_REQUIRED),
        (node(us.UPGRADE_REQUIRED, OLD), ON, False, None),
        (node(us.UPGRADE_REQUIRED, OLD, skip=True), ON, True, None),
        (
            node(us.UPGRADE_REQUIRED, us.DriverPod("d", "ns", in_sync=False, restart_only=True)),
            ON,
            True,
            us.POD_RESTART_REQUIRED,
        ),
        (
            node(
                us.UPGRADE_REQUIRED,
                us.DriverPod("d", "ns", in_sync=False, restart_only=True),
                annotations={UPGRADE_REQUESTED_ANNOTATION: "true"},
            ),
            ON,
            True,
            us.CORDON_REQUIRED,
        ),
        (node(us.CORDON_REQUIRED, OLD), ON, False, us.WAIT_FOR_JOBS_REQUIRED),
        # wait-for-jobs: no selector -> straight on; selector with running pods -> wait
        (node(us.WAIT_FOR_JOBS_REQUIRED, OLD), ON, False, us.POD_DELETION_REQUIRED),
        (
            node(us.WAIT_FOR_JOBS_REQUIRED, OLD, pods=(us.PodFacts("j", "ns", wait_match=True),)),
            us.Policy(auto_upgrade=True, wait_selector="app=job"),
            False,
            None,
        ),
        (
            node(
                us.WAIT_FOR_JOBS_REQUIRED,
                OLD,
                pods=(us.PodFacts("j", "ns", wait_match=True, phase="Succeeded"),),
            ),
            us.Policy(auto_upgrade=True, wait_selector="app=job"),
            False,
            us.POD_DELETION_REQUIRED,
        ),
        (
            node(
                us.WAIT_FOR_JOBS_REQUIRED,
                OLD,
                pods=(us.PodFacts("j", "ns", wait_match=True),),
                annotations={UPGRADE_WAIT_FOR_COMPLETION_START_ANNOTATION: str(NOW - 61)},
            ),
            us.Policy(auto_upgrade=True, wait_selector="app=job", wait_timeout=60),
            False,
            us.POD_DELETION_REQUIRED,
        ),
        # pod deletion: none left -> restart (or drain when enabled)
        (node(us.POD_DELETION_REQUIRED, OLD), ON, False, us.POD_RESTART_REQUIRED),
        (
            node(us.POD_DELETION_REQUIRED, OLD),
            us.Policy(auto_upgrade=True, drain_enable=True),
            False,
            us.DRAIN_REQUIRED,
        ),
        (
            node(us.POD_DELETION_REQUIRED, OLD, pods=(gpu_pod(controlled=False),)),
            ON,
            False,
            us.UPGRADE_FAILED,
        ),
        (
            node(us.POD_DELETION_REQUIRED, OLD, pods=(gpu_pod(controlled=False),)),
            us.Policy(auto_upgrade=True, drain_enable=True),
            False,
            us.DRAIN_REQUIRED,
        ),
        (node(us.DRAIN_REQUIRED, OLD), ON, False, us.POD_RESTART_REQUIRED),  # drain disabled
        (
            node(
                us.DRAIN_REQUIRED,
                OLD,
                pods=(us.PodFacts("ds", "ns", daemonset=True), us.PodFacts("op", "ns", drain_skip=True)),
            ),
            us.Policy(auto_upgrade=True, drain_enable=True),
            False,
            us.POD_RESTART_REQUIRED,
        ),
        # pod restart: in sync and ready -> validation; crash loop -> failed
        (node(us.POD_RESTART_REQUIRED, NEW), ON, False, us.VALIDATION_REQUIRED),
        (
            node(us.POD_RESTART_REQUIRED, us.DriverPod("d", "ns", in_sync=True, restarts=11)),
            ON,
            False,
            us.UPGRADE_FAILED,
        ),
        (node(us.POD_RESTART_REQUIRED, us.DriverPod("d", "ns", in_sync=True, restarts=3)), ON, False, None),
        (node(us.POD_RESTART_REQUIRED, None), ON, False, None),
        (node(us.VALIDATION_REQUIRED, NEW, validators_ready=True), ON, False, us.UNCORDON_REQUIRED),
        (
            node(
                us.VALIDATION_REQUIRED,
                NEW,
                validators_ready=True,
                annotations={UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: "true"},
            ),
            ON,
            False,
            us.UPGRADE_DONE,
        ),
        (
            node(
                us.VALIDATION_REQUIRED,
                NEW,
                validators_ready=False,
                annotations={UPGRADE_VALIDATION_START_ANNOTATION: str(NOW - 601)},
            ),
            ON,
            False,
            us.UPGRADE_FAILED,
        ),
        (
            node(
                us.VALIDATION_REQUIRED,
                NEW,
                validators_ready=False,
                annotations={UPGRADE_VALIDATION_START_ANNOTATION: str(NOW - 30)},
            ),
            ON,
            False,
            None,
        ),
        (node(us.UNCORDON_REQUIRED, NEW), ON, False, us.UPGRADE_DONE),
        # failed -> recovered when the driver pod is in sync and ready
        (node(us.UPGRADE_FAILED, NEW), ON, False, us.UNCORDON_REQUIRED),
        (node(us.UPGRADE_FAILED, OLD), ON, False, None),
        (node(us.UPGRADE_FAILED, us.DriverPod("d", "ns", in_sync=True, ready=False)), ON, False, None),
    ],
)
def test_transition(facts: us.UpgradeNodeFacts, policy: us.Policy, may_start: bool, want: str | None) -> None:
    step = us.decide(facts, policy, NOW, may_start)
    assert step.state == want


def test_cordon_and_uncordon_actions() -> None:
    assert us.decide(node(us.CORDON_REQUIRED, OLD), ON, NOW, False).cordon is True
    assert us.decide(node(us.UNCORDON_REQUIRED, NEW), ON, NOW, False).cordon is False
    restart = us.decide(
        node(us.UPGRADE_REQUIRED, us.DriverPod("d", "ns", in_sync=False, restart_only=True)), ON, NOW, True
    )
    assert restart.cordon is True


def test_initially_unschedulable_node_is_remembered_and_not_uncordoned() -> None:
    step = us.decide(node(us.UPGRADE_REQUIRED, OLD, unschedulable=True), ON, NOW, True)
    assert step.annotations[UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION] == "true"
    # a node cordoned by us, retried: "false" is kept, so it is uncordoned at the end
    retried = us.decide(
        node(
            us.UPGRADE_REQUIRED,
            OLD,
            unschedulable=True,
            annotations={UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: "false"},
        ),
        ON,
        NOW,
        True,
    )
    assert UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION not in retried.annotations
    done = us.decide(
        node(
            us.VALIDATION_REQUIRED,
            NEW,
            validators_ready=True,
            annotations={UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: "false"},
        ),
        ON,
        NOW,
        False,
    )
    assert done.state == us.UNCORDON_REQUIRED


def test_requested_annotation_is_removed_when_processed() -> None:
    step = us.decide(
        node(us.UPGRADE_REQUIRED, NEW, annotations={UPGRADE_REQUESTED_ANNOTATION: "true"}), ON, NOW, True
    )
    assert step.state == us.CORDON_REQUIRED
    assert step.annotations[UPGRADE_REQUESTED_ANNOTATION] is None


def test_out_of_date_driver_pod_is_deleted_once() -> None:
    assert us.decide(node(us.POD_RESTART_REQUIRED, OLD), ON, NOW, False).delete_driver_pod
    terminating = us.DriverPod("d", "ns", in_sync=False, terminating=True)
    assert not us.decide(node(us.POD_RESTART_REQUIRED, terminating), ON, NOW, False).delete_driver_pod


def test_safe_load_annotation_cleared_at_pod_restart() -> None:
    step = us.decide(
        node(us.POD_RESTART_REQUIRED, NEW, annotations={UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION: "true"}),
        ON,
        NOW,
        False,
    )
    assert step.annotations[UPGRADE_WAIT_FOR_SAFE_LOAD_ANNOTATION] is None


def test_pod_deletion_evicts_gpu_pods_then_times_out() -> None:
    pods = (gpu_pod("a"), us.PodFacts("cpu", "work"))
    first = us.decide(node(us.POD_DELETION_REQUIRED, OLD, pods=pods), ON, NOW, False)
    assert [p.name for p in first.evict] == ["a"]
    assert first.annotations[UPGRADE_POD_DELETION_START_ANNOTATION] == str(int(NOW))
    late = node(
        us.POD_DELETION_REQUIRED,
        OLD,
        pods=(gpu_pod("a", blocked_by="work/pdb"),),
        annotations={UPGRADE_POD_DELETION_START_ANNOTATION: str(NOW - 301)},
    )
    failed = us.decide(late, ON, NOW, False)
    assert failed.state == us.UPGRADE_FAILED
    assert "PodDisruptionBudget work/pdb" in failed.annotations[UPGRADE_FAILURE_REASON_ANNOTATION]  # type: ignore[operator]


def test_drain_blocked_by_pdb_fails_naming_it() -> None:
    policy = us.Policy(auto_upgrade=True, drain_enable=True, drain_timeout=30)
    pods = (us.PodFacts("w", "work", blocked_by="work/keep-one"),)
    waiting = us.decide(
        node(us.DRAIN_REQUIRED, OLD, pods=pods, annotations={UPGRADE_DRAIN_START_ANNOTATION: str(NOW - 10)}),
        policy,
        NOW,
        False,
    )
    assert waiting.state is None and [p.name for p in waiting.evict] == ["w"]
    failed = us.decide(
        node(us.DRAIN_REQUIRED, OLD, pods=pods, annotations={UPGRADE_DRAIN_START_ANNOTATION: str(NOW - 31)}),
        policy,
        NOW,
        False,
    )
    assert failed.state == us.UPGRADE_FAILED
    reason = failed.annotations[UPGRADE_FAILURE_REASON_ANNOTATION]
    assert reason is not None and "PodDisruptionBudget work/keep-one" in reason and "30s" in reason


def test_drain_refuses_unmanaged_and_emptydir_pods_without_force() -> None:
    policy = us.Policy(auto_upgrade=True, drain_enable=True)
    bare = node(us.DRAIN_REQUIRED, OLD, pods=(us.PodFacts("bare", "ns", controlled=False),))
    assert us.decide(bare, policy, NOW, False).state == us.UPGRADE_FAILED
    forced = us.Policy(auto_upgrade=True, drain_enable=True, drain_force=True)
    assert us.decide(bare, forced, NOW, False).evict
    scratch = node(us.DRAIN_REQUIRED, OLD, pods=(us.PodFacts("s", "ns", empty_dir=True),))
    assert us.decide(scratch, policy, NOW, False).state == us.UPGRADE_FAILED
    assert us.decide(
        scratch, us.Policy(auto_upgrade=True, drain_enable=True, drain_empty_dir=True), NOW, False
    ).evict


@pytest.mark.parametrize(
    ("value", "total", "want"),
    [
        (3, 20, 3),
        ("3", 20, 3),
        ("25%", 20, 5),
        ("25%", 21, 6),
        ("100%", 7, 7),
        ("0%", 9, 0),
        ("10%", 1, 1),
    ],
)
def test_max_unavailable(value: int | str, total: int, want: int) -> None:
    assert us.Policy(max_unavailable=value).unavailable_limit(total) == want


def cluster(n: int, state: str = us.UPGRADE_REQUIRED, **kw: Any) -> list[us.UpgradeNodeFacts]:
    return [node(state, OLD, name=f"n{i:02}", **kw) for i in range(n)]


def started(p: us.UpgradePlan) -> list[str]:
    return [s.node for s in p.steps if s.state in (us.CORDON_REQUIRED, us.POD_RESTART_REQUIRED)]


@pytest.mark.parametrize(
    ("max_parallel", "max_unavailable", "in_flight", "cordoned", "want"),
    [
        (5, "100%", 0, 0, 5),
        (5, "100%", 3, 0, 2),
        (5, "100%", 5, 0, 0),
        (0, "100%", 0, 0, 20),  # 0: all at once
        (5, 2, 0, 0, 2),  # maxUnavailable caps slots
        (5, "10%", 0, 0, 2),  # 10% of 20
        (5, 3, 0, 2, 3),  # two cordoned nodes count as unavailable (one slot left) and start without one
        (5, 2, 0, 2, 2),  # no unavailability left, but the cordoned ones proceed
        (1, "100%", 0, 2, 1),  # ... within maxParallelUpgrades all the same
    ],
)
def test_slots(
    max_parallel: int, max_unavailable: int | str, in_flight: int, cordoned: int, want: int
) -> None:
    nodes = cluster(20 - in_flight - cordoned)
    nodes += [node(us.WAIT_FOR_JOBS_REQUIRED, OLD, name=f"f{i}") for i in range(in_flight)]
    nodes += [node(us.UPGRADE_REQUIRED, OLD, name=f"c{i}", unschedulable=True) for i in range(cordoned)]
    policy = us.Policy(auto_upgrade=True, max_parallel=max_parallel, max_unavailable=max_unavailable)
    result = us.plan(nodes, policy, NOW)
    assert len(started(result)) == want


def test_not_ready_nodes_count_as_unavailable() -> None:
    nodes = cluster(8) + [node(us.UPGRADE_DONE, NEW, name=f"x{i}", ready=False) for i in range(2)]
    result = us.plan(nodes, us.Policy(auto_upgrade=True, max_parallel=5, max_unavailable=3), NOW)
    assert len(started(result)) == 1


def test_pause_starts_no_new_node_but_in_flight_nodes_continue() -> None:
    nodes = cluster(3) + [node(us.CORDON_REQUIRED, OLD, name="z")]
    result = us.plan(
        nodes, us.Policy(auto_upgrade=True, max_parallel=5, max_unavailable="100%"), NOW, paused=True
    )
    assert started(result) == []
    assert [s.node for s in result.steps] == ["z"]


def test_skip_label_holds_without_taking_a_slot() -> None:
    nodes = [node(us.UPGRADE_REQUIRED, OLD, name="a", skip=True), node(us.UPGRADE_REQUIRED, OLD, name="b")]
    result = us.plan(nodes, us.Policy(auto_upgrade=True, max_parallel=1, max_unavailable="100%"), NOW)
    assert started(result) == ["b"]


def test_auto_upgrade_off_removes_state_labels() -> None:
    nodes = [
        node(us.UPGRADE_DONE, NEW, name="a"),
        node("", NEW, name="b"),
        node(us.DRAIN_REQUIRED, OLD, name="c"),
    ]
    result = us.plan(nodes, us.Policy(auto_upgrade=False), NOW)
    assert [(s.node, s.remove_state) for s in result.steps] == [("a", True), ("c", True)]


def test_counts() -> None:
    nodes = (
        cluster(3)
        + [node(us.UPGRADE_DONE, NEW, name="d")]
        + [node(us.UPGRADE_FAILED, OLD, name="f")]
        + [node(us.DRAIN_REQUIRED, OLD, name="g")]
    )
    c = us.plan(nodes, us.Policy(auto_upgrade=True, max_parallel=4, max_unavailable="100%"), NOW).counts
    assert (c.total, c.in_progress, c.done, c.failed, c.pending) == (6, 2, 1, 1, 3)


def test_latest_revision_hash() -> None:
    revs = [
        {"revision": 1, "metadata": {"labels": {"controller-revision-hash": "aaa"}}},
        {"revision": 3, "metadata": {"labels": {"controller-revision-hash": "ccc"}}},
        {"revision": 2, "metadata": {"labels": {"controller-revision-hash": "bbb"}}},
    ]
    assert us.latest_revision_hash(revs) == "ccc"
    assert us.latest_revision_hash([]) is None


def test_policy_of_the_api_model_values_and_defaults() -> None:
    p = us.Policy.of(
        DriverUpgradePolicySpec.model_validate(
            {
                "autoUpgrade": True,
                "maxParallelUpgrades": 5,
                "maxUnavailable": 2,
                "podDeletion": {"timeoutSeconds": 7},
                "drain": {"enable": True},
            }
        )
    )
    assert (
        p.auto_upgrade,
        p.max_parallel,
        p.max_unavailable,
        p.deletion_timeout,
        p.drain_enable,
        p.drain_timeout,
    ) == (True, 5, 2, 7, True, 300)
    assert us.Policy.of(None) == us.Policy()
    # Every default is the api model's: an empty upgradePolicy reads as the dataclass defaults.
    assert us.Policy.of(DriverUpgradePolicySpec()) == us.Policy()


def test_retry_patch() -> None:
    patch = us.retry_patch({})
    assert patch["metadata"]["labels"][UPGRADE_STATE] == us.UPGRADE_REQUIRED
    assert patch["metadata"]["annotations"][UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION] == "false"
    kept = us.retry_patch({UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: "true"})
    assert UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION not in kept["metadata"]["annotations"]
