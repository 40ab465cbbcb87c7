"""The remediation state machine, pure: slots, the driver upgrade, escalation, failures, flapping."""

from __future__ import annotations

import json
from typing import Any

from gpu_operator.api.health import HealthReport
from gpu_operator.api.healthpolicy import FlappingSpec, RemediationSpec
from gpu_operator.controllers import health_machine as hm
from gpu_operator.controllers import upgrade_state as us
from gpu_operator.vocabulary import UPGRADE_STATE

NOW = 1_000_000.0
SPEC = RemediationSpec(enabled=True)
BUS = "0000:3b:00.0"


def rep(action: str | None = "reboot", validated: bool = True) -> HealthReport:
    gpus = [{"bus": BUS, "state": "unhealthy", "xid": 79, "action": action, "reason": "r"}] if action else []
    return HealthReport.parse(json.dumps({
        "v": 1, "validated": validated, "state": "unhealthy" if gpus else "healthy",
        "action": action or "none", "healthy": 7, "gpus": gpus, "sources": ["kmsg"],
        "missing": [] if validated else ["cuda"]}))


def node(name: str = "n", state: str = "", notes: dict[str, str] | None = None, **kw: Any) -> hm.Facts:
    return hm.Facts(name, state, notes or {}, report=kw.pop("report", rep()), **kw)


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
    pods = (us.PodFacts("w", "ml", gpu=True), us.PodFacts("ds", "ml", gpu=True, daemonset=True),
            us.PodFacts("cpu", "ml", gpu=False), us.PodFacts("other", "ml", gpu=True, drain_match=False))
    first = hm.decide(node(state=hm.DRAINING, pods=pods), SPEC, NOW, True)
    assert [p.name for p in first.evict] == ["w"] and first.notes[hm.DRAIN_START] == str(int(NOW))
    blocked = (us.PodFacts("w", "ml", gpu=True, blocked_by="ml/budget"),)
    late = hm.decide(node(state=hm.DRAINING, notes={hm.DRAIN_START: str(int(NOW) - 301)}, pods=blocked),
                     SPEC, NOW, True)
    assert late.result == "failed" and late.state == hm.DRAINING and late.notes[hm.ATTEMPTS] == "1"
    loose = hm.decide(node(state=hm.DRAINING, pods=(us.PodFacts("bare", "ml", gpu=True, controlled=False),)),
                      SPEC, NOW, True)
    assert loose.result == "failed" and loose.evict == ()


def test_actions_request_what_they_cannot_do_themselves() -> None:
    def act(action: str, spec: RemediationSpec) -> hm.Step:
        index = spec.actions.index(action)  # type: ignore[arg-type]
        return hm.decide(node(state=hm.ACTING, notes={hm.STEP: str(index)}), spec, NOW, True)
    assert act("reboot", SPEC).notes[hm.REBOOT_REQUESTED] == str(int(NOW))
    assert act("reset-gpu", SPEC).notes[hm.RESET_REQUESTED] == BUS
    assert act("reload-driver", SPEC).action == "reload-driver"
    assert act("restart-device-plugin", SPEC).action == "restart-device-plugin"
    ext = RemediationSpec.model_validate({"enabled": True, "actions": ["external"],
                                          "externalHandoff": {"label": "example.com/repair"}})
    handed = act("external", ext)
    assert handed.labels == {"example.com/repair": "requested"} and handed.state == hm.VALIDATING


def test_validation_timeout_escalates_then_fails_after_max_attempts() -> None:
    old = str(int(NOW) - 601)
    step = hm.decide(node(state=hm.VALIDATING, notes={hm.SINCE: old, hm.STEP: "0", hm.ACTION: "restart-device-plugin"}),
                     SPEC, NOW, True)
    assert (step.state, step.notes[hm.STEP], step.notes[hm.ATTEMPTS], step.result) == (hm.DRAINING, "1", "1", "failed")
    last = hm.decide(node(state=hm.VALIDATING, notes={hm.SINCE: old, hm.STEP: "3", hm.ATTEMPTS: "2"}), SPEC, NOW, True)
    assert last.state == hm.FAILED and str(last.notes[hm.REASON]).startswith("3 remediation attempts failed")
    assert hm.decide(node(state=hm.FAILED, report=rep(None)), SPEC, NOW, True).empty  # stays until retry


def test_validated_healthy_releases_and_uncordons_only_what_we_cordoned() -> None:
    ours = hm.decide(node(state=hm.VALIDATING, notes={hm.INITIALLY_UNSCHEDULABLE: "false", hm.SINCE: str(int(NOW))},
                          report=rep(None)), SPEC, NOW, True)
    assert ours.remove_state and ours.cordon is False and ours.result == "succeeded"
    theirs = hm.decide(node(state=hm.VALIDATING, notes={hm.INITIALLY_UNSCHEDULABLE: "true", hm.SINCE: str(int(NOW))},
                            report=rep(None)), SPEC, NOW, True)
    assert theirs.remove_state and theirs.cordon is None
    pending = hm.decide(node(state=hm.VALIDATING, notes={hm.REBOOT_REQUESTED: "1", hm.SINCE: str(int(NOW))},
                             report=rep(None)), SPEC, NOW, True)
    assert pending.empty  # the agent has not done the reboot yet


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
    busy = us.NodeFacts("n1", labels={UPGRADE_STATE: us.UPGRADE_REQUIRED, "nvidia.com/gpu-health.state": hm.DRAINING},
                        driver=driver)
    idle = us.NodeFacts("n2", labels={UPGRADE_STATE: us.UPGRADE_REQUIRED}, driver=driver)
    steps = {s.node: s.state for s in us.plan([busy, idle], policy, NOW).steps}
    assert steps == {"n2": us.CORDON_REQUIRED}
    assert us.HEALTH_REMEDIATING == hm.ACTIVE


def test_release_never_removes_the_agents_report() -> None:
    """The report shares the machine's annotation prefix (nvidia.com/gpu-health.): it is the
    agent's, not the machine's memory, so a release must leave it (without it the node's condition
    would go and a quiet agent would not write it again)."""
    from gpu_operator.controllers.cache import NodeView
    from gpu_operator.vocabulary import HEALTH_REPORT_ANNOTATION, HEALTH_STATE

    healthy = rep(None).model_dump_json(exclude_defaults=True)
    view = NodeView.of({"metadata": {"name": "n", "labels": {HEALTH_STATE: hm.VALIDATING}, "annotations": {
        HEALTH_REPORT_ANNOTATION: healthy, hm.SINCE: str(int(NOW)), hm.ACTION: "reset-gpu",
        hm.INITIALLY_UNSCHEDULABLE: "false"}}, "spec": {"unschedulable": True}})
    facts = hm.node_facts(view)
    assert HEALTH_REPORT_ANNOTATION not in facts.annotations and facts.recovered
    step = hm.decide(facts, SPEC, NOW, True)
    assert step.remove_state and step.cordon is False
    assert set(step.notes) == {hm.SINCE, hm.ACTION, hm.INITIALLY_UNSCHEDULABLE}  # ours only, all removed
