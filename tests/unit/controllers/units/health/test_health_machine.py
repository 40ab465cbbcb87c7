"""The remediation state machine, pure: slots, the driver upgrade, escalation, failures, flapping."""

from __future__ import annotations

import json
from typing import Any

from gpu_operator.api.health import HealthReport
from gpu_operator.api.healthpolicy import FlappingSpec, RemediationSpec
from gpu_operator.controllers.units.health import machine as hm
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.vocabulary import UPGRADE_STATE

NOW = 1_000_000.0
SPEC = RemediationSpec(enabled=True)
BUS = "0000:3b:00.0"


def rep(
    action: str | None = "reboot",
    validated: bool = True,
    answered: str | None = None,
    at: float | None = NOW + 1,
) -> HealthReport:
    gpus = [{"bus": BUS, "state": "unhealthy", "xid": 79, "action": action, "reason": "r"}] if action else []
    return HealthReport.parse(
        json.dumps(
            {
                "v": 1,
                "validated": validated,
                "state": "unhealthy" if gpus else "healthy",
                "action": action or "none",
                "healthy": 7,
                "gpus": gpus,
                "sources": ["kmsg"],
                "missing": [] if validated else ["cuda"],
                **({"answered": answered} if answered else {}),
                **({"validatedAt": at} if validated and at is not None else {}),
            }
        )
    )


def node(
    name: str = "n", state: str = "", notes: dict[str, str] | None = None, **kw: Any
) -> hm.RemediationFacts:
    return hm.RemediationFacts(name, state, notes or {}, report=kw.pop("report", rep()), **kw)


def test_unhealthy_node_is_quarantined_and_flapping_is_held() -> None:
    step = hm.decide(node(), SPEC, NOW, True)
    assert step.state == hm.QUARANTINED and step.notes[hm.UNHEALTHY_AT] == str(int(NOW))
    spec = RemediationSpec(enabled=True, flapping=FlappingSpec(transitions=3, windowSeconds=600))
    seen = f"{int(NOW) - 700},{int(NOW) - 300},{int(NOW) - 100}"  # the first is outside the window
    held = hm.decide(node(notes={hm.UNHEALTHY_AT: seen}), spec, NOW, True)
    assert held.state == hm.HELD and str(held.notes[hm.REASON]).startswith("flapping")


def test_max_unavailable_bounds_who_starts() -> None:
    nodes = [node(f"n{i}", hm.QUARANTINED, {hm.SINCE: str(int(NOW) - 10 + i)}) for i in range(3)]
    steps = hm.plan(nodes, SPEC, NOW).steps
    assert [(s.node, s.state) for s in steps] == [("n0", hm.DRAINING)]
    spec = RemediationSpec(enabled=True, maxUnavailable="50%")
    assert [s.node for s in hm.plan(nodes, spec, NOW).steps] == ["n0", "n1"]
    busy = [node("a", hm.VALIDATING, {hm.SINCE: str(int(NOW))}), *nodes]
    assert [s.state for s in hm.plan(busy, SPEC, NOW).steps] == []


def test_never_during_a_driver_upgrade() -> None:
    n = node(state=hm.QUARANTINED, labels={UPGRADE_STATE: us.DRAIN_REQUIRED})
    assert hm.decide(n, SPEC, NOW, True).empty


def test_first_action_strong_enough_and_cordon_owner() -> None:
    step = hm.decide(node(state=hm.QUARANTINED, unschedulable=True), SPEC, NOW, True)
    assert step.state == hm.DRAINING and step.cordon is True
    assert step.notes[hm.STEP] == "3"  # Xid 79 asks for a reboot: index of reboot in the defaults
    assert step.notes[hm.INITIALLY_UNSCHEDULABLE] == "true"
    weak = RemediationSpec(enabled=True, actions=["restart-device-plugin"])
    failed = hm.decide(node(state=hm.QUARANTINED), weak, NOW, True)
    assert failed.state == hm.FAILED


def test_drain_evicts_gpu_pods_then_fails_on_pdb_after_timeout() -> None:
    pods = (
        us.PodFacts("w", "ml", gpu=True),
        us.PodFacts("ds", "ml", gpu=True, daemonset=True),
        us.PodFacts("cpu", "ml", gpu=False),
        us.PodFacts("other", "ml", gpu=True, drain_match=False),
    )
    first = hm.decide(node(state=hm.DRAINING, pods=pods), SPEC, NOW, True)
    assert [p.name for p in first.evict] == ["w"] and first.notes[hm.DRAIN_START] == str(int(NOW))
    blocked = (us.PodFacts("w", "ml", gpu=True, blocked_by="ml/budget"),)
    late = hm.decide(
        node(state=hm.DRAINING, notes={hm.DRAIN_START: str(int(NOW) - 301)}, pods=blocked), SPEC, NOW, True
    )
    assert late.result == "failed" and late.state == hm.DRAINING and late.notes[hm.ATTEMPTS] == "1"
    loose = hm.decide(
        node(state=hm.DRAINING, pods=(us.PodFacts("bare", "ml", gpu=True, controlled=False),)),
        SPEC,
        NOW,
        True,
    )
    assert loose.result == "failed" and loose.evict == ()


def test_actions_request_what_they_cannot_do_themselves() -> None:
    def act(action: str, spec: RemediationSpec) -> hm.RemediationStep:
        index = spec.actions.index(action)  # type: ignore[arg-type]
        return hm.decide(node(state=hm.ACTING, notes={hm.STEP: str(index)}), spec, NOW, True)

    reboot = act("reboot", SPEC)
    reset = hm.decide(node(state=hm.ACTING, notes={hm.STEP: "1", hm.PAUSED: ""}), SPEC, NOW, True)
    # the request is the node's entry in the requests Secret, never a Node annotation
    assert not any(k.endswith("-requested") for k in {**reboot.notes, **reset.notes})
    assert json.loads(reboot.request) == {
        "v": 1,
        "node": "n",
        "action": "reboot",
        "gpus": [],
        "remediation": True,
        "attempt": 0,
        "since": str(int(NOW)),
    }
    assert json.loads(reset.request)["gpus"] == [BUS] and reset.notes[hm.SINCE] == str(int(NOW))
    assert act("reload-driver", SPEC).action == "reload-driver" and not act("reload-driver", SPEC).request
    assert act("restart-device-plugin", SPEC).action == "restart-device-plugin"
    ext = RemediationSpec.model_validate(
        {"enabled": True, "actions": ["external"], "externalHandoff": {"label": "example.com/repair"}}
    )
    handed = act("external", ext)
    assert handed.labels == {"example.com/repair": "requested"} and handed.state == hm.VALIDATING


def test_validation_timeout_escalates_then_fails_after_max_attempts() -> None:
    old = str(int(NOW) - 601)
    step = hm.decide(
        node(state=hm.VALIDATING, notes={hm.SINCE: old, hm.STEP: "0", hm.ACTION: "restart-device-plugin"}),
        SPEC,
        NOW,
        True,
    )
    assert (step.state, step.notes[hm.STEP], step.notes[hm.ATTEMPTS], step.result) == (
        hm.DRAINING,
        "1",
        "1",
        "failed",
    )
    last = hm.decide(
        node(state=hm.VALIDATING, notes={hm.SINCE: old, hm.STEP: "3", hm.ATTEMPTS: "2"}), SPEC, NOW, True
    )
    assert last.state == hm.FAILED and str(last.notes[hm.REASON]).startswith("3 remediation attempts failed")
    assert hm.decide(node(state=hm.FAILED, report=rep(None)), SPEC, NOW, True).empty  # stays until retry


def test_validated_healthy_releases_and_uncordons_only_what_we_cordoned() -> None:
    acted = {hm.SINCE: str(int(NOW)), hm.ACTION: "restart-device-plugin", hm.REVALIDATED: f"{NOW:.3f}"}
    ours = hm.decide(
        node(state=hm.VALIDATING, notes={hm.INITIALLY_UNSCHEDULABLE: "false", **acted}, report=rep(None)),
        SPEC,
        NOW,
        True,
    )
    assert ours.remove_state and ours.cordon is False and ours.result == "succeeded"
    theirs = hm.decide(
        node(state=hm.VALIDATING, notes={hm.INITIALLY_UNSCHEDULABLE: "true", **acted}, report=rep(None)),
        SPEC,
        NOW,
        True,
    )
    assert theirs.remove_state and theirs.cordon is None
    # the status files the validator wrote before the action do not release the node, nor does no time
    for stale in (rep(None, at=NOW - 5), rep(None, at=NOW), rep(None, at=None)):
        assert hm.decide(node(state=hm.VALIDATING, notes=acted, report=stale), SPEC, NOW, True).empty
    # an action carried out by the operator restarts the validator with it
    restart = hm.decide(node(state=hm.ACTING, notes={hm.STEP: "0"}), SPEC, NOW, True)
    assert restart.action == "restart-device-plugin" and restart.notes[hm.REVALIDATED] == f"{NOW:.3f}"
    since = str(int(NOW))
    asked = {hm.ACTION: "reboot", hm.SINCE: since, hm.ATTEMPTS: "1"}
    pending = hm.decide(node(state=hm.VALIDATING, notes=asked, report=rep(None)), SPEC, NOW, True)
    assert pending.empty  # the agent has not done the reboot yet
    # an answer to another request (an earlier attempt's) is no answer
    other = hm.decide(
        node(state=hm.VALIDATING, notes=asked, report=rep(None, answered=f"reboot:0:{since}")),
        SPEC,
        NOW,
        True,
    )
    assert other.empty
    answered = hm.decide(
        node(state=hm.VALIDATING, notes=asked, report=rep(None, answered=f"reboot:1:{since}")),
        SPEC,
        NOW,
        True,
    )
    assert answered.withdraw and answered.notes == {
        hm.ANSWERED: since,
        hm.REVALIDATED: f"{NOW:.3f}",
        hm.PAUSED: None,
    }
    assert not answered.remove_state and answered.action == ""  # the reboot restarts the validation
    reset = hm.decide(
        node(
            state=hm.VALIDATING,
            notes={**asked, hm.ACTION: "reset-gpu"},
            report=rep(None, answered=f"reset-gpu:1:{since}"),
        ),
        SPEC,
        NOW,
        True,
    )
    assert (
        reset.action == hm.VALIDATOR_RESTART and reset.withdraw
    )  # after a reset, the validator pod restarts
    answered_notes = {**asked, hm.ANSWERED: since, hm.REVALIDATED: f"{NOW:.3f}"}
    old = hm.decide(
        node(state=hm.VALIDATING, notes=answered_notes, report=rep(None, at=NOW - 60)), SPEC, NOW, True
    )
    assert old.empty  # the validation from before the reboot
    done = hm.decide(node(state=hm.VALIDATING, notes=answered_notes, report=rep(None)), SPEC, NOW, True)
    assert done.remove_state and done.withdraw and done.result == "succeeded"


def test_retry_and_hold_patches() -> None:
    retry = hm.retry_patch({hm.ATTEMPTS: "3", hm.REASON: "x"})
    assert retry["metadata"]["labels"] == {"nvidia.com/gpu-health.state": hm.QUARANTINED}
    assert retry["metadata"]["annotations"][hm.ATTEMPTS] is None
    hold = hm.hold_patch("held by hand", NOW)
    assert hold["metadata"]["labels"] == {"nvidia.com/gpu-health.state": hm.HELD}


def test_switched_off_releases_every_node() -> None:
    plan = hm.release_all([node(state=hm.DRAINING, notes={hm.INITIALLY_UNSCHEDULABLE: "false"})], SPEC)
    assert [(s.remove_state, s.cordon) for s in plan.steps] == [(True, False)]


def test_a_driver_upgrade_waits_for_remediation() -> None:
    policy = us.Policy(auto_upgrade=True, max_unavailable=10)
    driver = us.DriverPod("d", "ns", in_sync=False)
    busy = us.UpgradeNodeFacts(
        "n1",
        labels={UPGRADE_STATE: us.UPGRADE_REQUIRED, "nvidia.com/gpu-health.state": hm.DRAINING},
        driver=driver,
    )
    idle = us.UpgradeNodeFacts("n2", labels={UPGRADE_STATE: us.UPGRADE_REQUIRED}, driver=driver)
    steps = {s.node: s.state for s in us.plan([busy, idle], policy, NOW).steps}
    assert steps == {"n2": us.CORDON_REQUIRED}
    assert us.HEALTH_REMEDIATING == hm.ACTIVE


def test_release_never_removes_the_agents_report() -> None:
    """The report shares the machine's annotation prefix (nvidia.com/gpu-health.): it is the
    agent's, not the machine's memory, so a release must leave it (without it the node's condition
    would go and a quiet agent would not write it again)."""
    from gpu_operator.controllers.views import NodeView
    from gpu_operator.vocabulary import HEALTH_REPORT_ANNOTATION, HEALTH_STATE

    healthy = rep(None, at=NOW + 1).model_dump_json(exclude_defaults=True)
    view = NodeView.of(
        {
            "metadata": {
                "name": "n",
                "labels": {HEALTH_STATE: hm.VALIDATING},
                "annotations": {
                    HEALTH_REPORT_ANNOTATION: healthy,
                    hm.SINCE: str(int(NOW)),
                    hm.ACTION: "reset-gpu",
                    hm.ANSWERED: str(int(NOW)),
                    hm.REVALIDATED: f"{NOW:.3f}",
                    hm.INITIALLY_UNSCHEDULABLE: "false",
                },
            },
            "spec": {"unschedulable": True},
        }
    )
    facts = hm.node_facts(view, HealthReport.parse(healthy))
    assert HEALTH_REPORT_ANNOTATION not in facts.annotations and facts.recovered
    step = hm.decide(facts, SPEC, NOW, True)
    assert step.remove_state and step.cordon is False
    assert set(step.notes) == {
        hm.SINCE,
        hm.ACTION,
        hm.ANSWERED,
        hm.REVALIDATED,
        hm.INITIALLY_UNSCHEDULABLE,
    }  # ours only, all removed


def test_a_reset_first_pauses_the_gpu_clients_waits_for_their_pods_and_resumes_them() -> None:
    """Only clients at `true` are paused (a value another owner set is left alone); the request is
    written once their pods are gone; the answer puts back what we paused, if still ours."""
    from gpu_operator.vocabulary import deploy_label

    plugin, dcgm, gfd = (
        deploy_label("device-plugin"),
        deploy_label("dcgm"),
        deploy_label("gpu-feature-discovery"),
    )
    labels = {plugin: "true", dcgm: "paused-for-driver-upgrade", gfd: "false"}
    acting = {hm.STEP: "1"}
    pause = hm.decide(node(state=hm.ACTING, notes=acting, labels=labels), SPEC, NOW, True)
    assert (
        pause.labels == {plugin: hm.PAUSED_VALUE} and pause.notes[hm.PAUSED] == plugin and not pause.request
    )
    paused = {**labels, plugin: hm.PAUSED_VALUE}
    notes = {**acting, hm.PAUSED: plugin, hm.SINCE: str(int(NOW))}
    waiting = hm.decide(
        node(state=hm.ACTING, notes=notes, labels=paused, clients=("gpu-operator/dp-x",)), SPEC, NOW + 5, True
    )
    assert waiting.empty  # the device plugin's pod still holds the GPUs
    late = hm.decide(
        node(state=hm.ACTING, notes=notes, labels=paused, clients=("gpu-operator/dp-x",)),
        SPEC,
        NOW + 301,
        True,
    )
    assert late.result == "failed" and late.labels == {plugin: "true"} and "gpu-operator/dp-x" in late.message
    asked = hm.decide(node(state=hm.ACTING, notes=notes, labels=paused), SPEC, NOW + 6, True)
    assert asked.state == hm.VALIDATING and json.loads(asked.request)["action"] == "reset-gpu"
    since = str(int(NOW + 6))
    done = {hm.ACTION: "reset-gpu", hm.SINCE: since, hm.PAUSED: plugin}
    answered = hm.decide(
        node(
            state=hm.VALIDATING,
            notes=done,
            labels={**paused, dcgm: "true"},
            report=rep(None, answered=f"reset-gpu:0:{since}"),
        ),
        SPEC,
        NOW + 7,
        True,
    )
    assert answered.labels == {plugin: "true"} and answered.notes[hm.PAUSED] is None
    # a paused label someone else changed meanwhile is theirs now
    taken = hm.decide(
        node(
            state=hm.VALIDATING,
            notes=done,
            labels={**paused, plugin: "false"},
            report=rep(None, answered=f"reset-gpu:0:{since}"),
        ),
        SPEC,
        NOW + 7,
        True,
    )
    assert taken.labels == {}
