"""The GPU health unit against a recorded fake Kube: one write per change, none while nothing
changes; only our condition and taints; remediation carried out step by step."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.health import HealthReport
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.controllers.loop import NodeEvent
from gpu_operator.controllers.units.health import machine as hm
from gpu_operator.controllers.units.health.dra import DeviceTaints
from gpu_operator.controllers.units.health.unit import HealthPassReport, HealthUnit
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_REPORT_ANNOTATION, HEALTH_STATE, HEALTH_TAINT
from tests.unit.controllers.healthkit import FakeDRA, FakeKube, slice_of

BUS = "0000:3b:00.0"
OTHER_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def report(validated: bool = True, *gpus: dict[str, Any]) -> str:
    order = ("healthy", "warning", "unhealthy", "gone")
    actions = ("none", "restart-app", "reset-gpu", "reboot")
    return json.dumps(
        {
            "v": 1,
            "validated": validated,
            "state": max((g["state"] for g in gpus), key=order.index, default="healthy"),
            "action": max((g["action"] for g in gpus), key=actions.index, default="none"),
            "healthy": 8 - len(gpus),
            "gpus": list(gpus),
            "sources": ["kmsg"],
            "missing": [] if validated else ["cuda"],
        }
    )


XID79 = report(
    True, {"bus": BUS, "state": "unhealthy", "xid": 79, "action": "reboot", "reason": "fell off the bus"}
)
XID48 = report(True, {"bus": BUS, "state": "unhealthy", "xid": 48, "action": "reset-gpu", "reason": "DBE"})
HEALTHY = report(True)


def policy(health: dict[str, Any] | None = None) -> ClusterPolicy:
    spec = {"health": health} if health is not None else {}
    return ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make(
    kube: FakeKube,
    pol: ClusterPolicy | None,
    clock: Clock | None = None,
    device_taints: DeviceTaints | None = None,
) -> HealthUnit:
    spec = (pol.spec.health or HealthSpec()) if pol is not None else None
    return HealthUnit(
        kube.views,
        kube.view,
        lambda: spec,
        kube,  # type: ignore[arg-type]
        clock=clock or Clock(),
        device_taints=device_taints,
    )


def run_pass(unit: HealthUnit, kube: FakeKube) -> HealthPassReport:
    """Hand the unit every node as the watch would, then one pass (if it asks for one)."""
    for name in list(kube.nodes):
        unit.wants(NodeEvent(name, kube.view(name)))
    result = asyncio.run(unit.reconcile())
    assert isinstance(result, HealthPassReport)
    return result


def gauge(node: str, state: str) -> float | None:
    return REGISTRY.get_sample_value("gpu_operator_node_gpu_health", {"node": node, "state": state})


def condition(kube: FakeKube, node: str) -> dict[str, Any] | None:
    return next((c for c in kube.nodes[node]["status"]["conditions"] if c["type"] == HEALTH_CONDITION), None)


def test_xid79_quarantines_with_one_write_each_then_nothing() -> None:
    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID79}, taints=[OTHER_TAINT])
    kube.add_node("cpu1")
    unit = make(kube, policy())
    run_pass(unit, kube)
    assert [c[:3] for c in kube.writes()] == [
        ("patch-status", "g1", HEALTH_CONDITION),
        ("patch", "g1", kube.writes()[1][2]),
        ("event", "g1", "GPUHealth"),
    ]
    cond = condition(kube, "g1")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "GPUUnhealthy")
    assert kube.nodes["g1"]["spec"]["taints"] == [OTHER_TAINT, {"key": HEALTH_TAINT, "effect": "NoSchedule"}]
    assert gauge("g1", "quarantined") == 1 and gauge("g1", "healthy") == 0
    assert gauge("cpu1", "healthy") is None
    before = len(kube.calls)
    again = run_pass(unit, kube)  # the echoes of our own writes
    assert kube.calls[before:] == [] and (again.conditions, again.taints, again.events) == (0, 0, 0)


def test_recovery_lifts_taint_and_sets_true_other_taints_kept() -> None:
    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID79}, taints=[OTHER_TAINT])
    unit = make(kube, policy())
    run_pass(unit, kube)
    kube.nodes["g1"]["metadata"]["annotations"][HEALTH_REPORT_ANNOTATION] = HEALTHY
    done = run_pass(unit, kube)
    assert (done.conditions, done.taints, done.events) == (1, 1, 1)
    cond = condition(kube, "g1")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "GPUsHealthy")
    assert kube.nodes["g1"]["spec"]["taints"] == [OTHER_TAINT]
    assert gauge("g1", "healthy") == 1 and gauge("g1", "quarantined") == 0
    assert kube.events[-1][3] is False  # a Normal event


def test_report_removed_takes_our_signals_away() -> None:
    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID79})
    unit = make(kube, policy())
    run_pass(unit, kube)
    del kube.nodes["g1"]["metadata"]["annotations"][HEALTH_REPORT_ANNOTATION]
    run_pass(unit, kube)
    assert condition(kube, "g1") is None and kube.nodes["g1"]["spec"].get("taints") in (None, [])
    assert gauge("g1", "quarantined") is None


def test_no_policy_no_writes() -> None:
    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID79})
    run_pass(make(kube, None), kube)
    assert kube.writes() == []


def test_noexecute_when_the_policy_asks() -> None:
    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID79})
    run_pass(make(kube, policy({"taintEffect": "NoExecute"})), kube)
    assert kube.nodes["g1"]["spec"]["taints"] == [{"key": HEALTH_TAINT, "effect": "NoExecute"}]


PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"


def test_remediation_walks_to_release() -> None:
    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID48}, labels={PLUGIN_LABEL: "true"})
    kube.add_pod("train", "g1", labels={"team": "ml"})
    kube.add_pod("keep", "g1", labels={"team": "other"})
    kube.add_pod("dp", "g1", gpu=False, labels={"app": "nvidia-device-plugin-daemonset"}, owner="DaemonSet")
    kube.add_pod("validator", "g1", gpu=False, labels={"app": "nvidia-operator-validator"}, owner="DaemonSet")
    clock = Clock()
    unit = make(
        kube,
        policy(
            {
                "remediation": {
                    "enabled": True,
                    "podSelector": "team=ml",
                    "actions": ["restart-device-plugin", "reset-gpu", "reboot"],
                }
            }
        ),
        clock,
    )

    def state() -> str:
        return str(kube.nodes["g1"]["metadata"]["labels"].get(HEALTH_STATE, ""))

    run_pass(unit, kube)
    assert state() == hm.QUARANTINED
    run_pass(unit, kube)
    assert state() == hm.DRAINING and kube.nodes["g1"]["spec"]["unschedulable"] is True
    # Xid 48 asks for a GPU reset: the machine starts at reset-gpu, not at the device plugin
    assert kube.nodes["g1"]["metadata"]["annotations"][hm.STEP] == "1"
    run_pass(unit, kube)  # evicts the selected GPU pod only
    assert [c for c in kube.calls if c[0] == "evict"] == [("evict", "default/train")]
    run_pass(unit, kube)
    assert state() == hm.ACTING
    run_pass(unit, kube)  # the GPU clients paused first: the device plugin's deploy label
    assert kube.nodes["g1"]["metadata"]["labels"][PLUGIN_LABEL] == hm.PAUSED_VALUE and state() == hm.ACTING
    run_pass(unit, kube)
    assert state() == hm.ACTING and kube.client.request("g1") is None  # its pod still holds the GPUs
    kube.pods = [p for p in kube.pods if p["metadata"]["name"] != "dp"]  # its DaemonSet took it away
    run_pass(unit, kube)
    notes = kube.nodes["g1"]["metadata"]["annotations"]
    asked = kube.client.request("g1")  # the node's entry in the requests Secret, in the operator's namespace
    assert state() == hm.VALIDATING and asked == {
        "v": 1,
        "node": "g1",
        "action": "reset-gpu",
        "gpus": [BUS],
        "remediation": True,
        "attempt": 0,
        "since": notes[hm.SINCE],
    }
    assert [p["metadata"]["name"] for p in kube.pods] == ["keep", "validator"]  # excluded by the selector
    # healthy and validated, but the request not answered: not released
    notes[HEALTH_REPORT_ANNOTATION] = HEALTHY
    run_pass(unit, kube)
    assert state() == hm.VALIDATING and kube.client.request("g1") is not None
    # the node agent resets the GPU and answers the request in its report: withdrawn, then released
    answered = {
        **json.loads(HEALTHY),
        "answered": f"reset-gpu:0:{notes[hm.SINCE]}",
        "validatedAt": clock.now - 30,
    }
    notes[HEALTH_REPORT_ANNOTATION] = json.dumps(answered)
    run_pass(unit, kube)
    assert (
        state() == hm.VALIDATING
        and kube.client.request("g1") is None
        and notes[hm.ANSWERED] == notes[hm.SINCE]
    )
    # the validator's pod restarted: the validation from before the reset does not release the node
    assert [p["metadata"]["name"] for p in kube.pods] == ["keep"]
    assert kube.nodes["g1"]["metadata"]["labels"][PLUGIN_LABEL] == "true"  # resumed
    run_pass(unit, kube)
    assert state() == hm.VALIDATING
    # the new validator pod's validation, newer than the reset
    notes[HEALTH_REPORT_ANNOTATION] = json.dumps(
        {**answered, "validatedAt": float(notes[hm.REVALIDATED]) + 5}
    )
    before = (
        REGISTRY.get_sample_value(
            "gpu_operator_health_remediations_total", {"node": "g1", "result": "succeeded"}
        )
        or 0
    )
    run_pass(unit, kube)
    assert state() == "" and kube.nodes["g1"]["spec"]["unschedulable"] is False
    assert kube.nodes["g1"]["spec"].get("taints") in (None, [])
    cond = condition(kube, "g1")
    assert cond is not None and cond["status"] == "True"
    assert (
        REGISTRY.get_sample_value(
            "gpu_operator_health_remediations_total", {"node": "g1", "result": "succeeded"}
        )
        == before + 1
    )


def test_device_plugin_restart_deletes_its_pod_on_the_node() -> None:
    kube = FakeKube()
    text = report(True, {"bus": BUS, "state": "unhealthy", "xid": 31, "action": "restart-app", "reason": "x"})
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: text})
    kube.add_pod("dp", "g1", gpu=False, labels={"app": "nvidia-device-plugin-daemonset"}, owner="DaemonSet")
    kube.add_pod(
        "dp-other", "g2", gpu=False, labels={"app": "nvidia-device-plugin-daemonset"}, owner="DaemonSet"
    )
    unit = make(kube, policy({"remediation": {"enabled": True}}))
    for _ in range(5):
        run_pass(unit, kube)
    assert ("delete", "default/dp") in kube.calls and ("delete", "default/dp-other") not in kube.calls
    assert kube.nodes["g1"]["metadata"]["labels"][HEALTH_STATE] == hm.VALIDATING


def test_runs_in_a_unit_loop_served_at_once() -> None:
    from gpu_operator.controllers.loop import Pacing, UnitLoop
    from gpu_operator.controllers.settings import Backoff

    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID79})
    unit = make(kube, policy())
    assert unit.pacing is Pacing.IDLE_FIRST
    loop = UnitLoop(unit, coalesce=5.0, backoff=Backoff())

    async def go() -> None:
        loop.offer(NodeEvent("g1", kube.view("g1")))
        assert loop.kick.is_set()
        await asyncio.wait_for(loop.step(None, 0.0), timeout=2.0)  # no coalescing wait while idle
        loop.offer(NodeEvent("g1", kube.view("g1")))  # the echo of our writes kicks once more ...
        await asyncio.wait_for(loop.step(None, 0.0), timeout=7.0)
        loop.offer(NodeEvent("g1", kube.view("g1")))  # ... and then nothing changes: no kick
        assert not loop.kick.is_set()

    asyncio.run(go())
    assert [c[0] for c in kube.writes()] == ["patch-status", "patch", "event"]


def test_take_back_undoes_condition_taint_and_our_cordon_only() -> None:
    from gpu_operator.controllers.units.health.executor import take_back

    kube = FakeKube()
    kube.add_node("g1", {HEALTH_REPORT_ANNOTATION: XID48})
    kube.add_pod("train", "g1")
    unit = make(kube, policy({"remediation": {"enabled": True}}))
    for _ in range(3):  # quarantined, draining (cordoned by us), evicting
        run_pass(unit, kube)
    kube.nodes["g1"]["spec"]["taints"].append(OTHER_TAINT)
    done = asyncio.run(take_back(kube, kube.nodes["g1"]))  # type: ignore[arg-type]
    assert len(done) == 3
    assert condition(kube, "g1") is None and kube.nodes["g1"]["spec"]["taints"] == [OTHER_TAINT]
    assert kube.nodes["g1"]["spec"]["unschedulable"] is False
    assert asyncio.run(take_back(kube, kube.nodes["g1"])) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("remediation", [True, False])
def test_a_pass_parses_each_nodes_report_once(monkeypatch: pytest.MonkeyPatch, remediation: bool) -> None:
    """The unit parses a node's report once per pass; the signals, the remediation machine and the
    DRA device taints share what it read (an unreadable report is refused once too)."""
    FakeDRA("v1", [slice_of("g1", ("gpu-0", BUS))]).install(monkeypatch)
    kube = FakeKube()
    texts = {"g1": XID48, "g2": HEALTHY, "g3": "{nope"}
    for name, text in texts.items():
        kube.add_node(name, {HEALTH_REPORT_ANNOTATION: text})
    owner = {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "name": "gpu-cluster", "uid": "u-1"}
    taints = DeviceTaints(kube, lambda: owner)  # type: ignore[arg-type]
    unit = make(kube, policy({"remediation": {"enabled": remediation}}), device_taints=taints)
    parsed: Counter[str] = Counter()
    parse = HealthReport.parse.__func__  # type: ignore[attr-defined]

    def counted(cls: type[HealthReport], text: str) -> HealthReport:
        parsed[text] += 1
        return parse(cls, text)  # type: ignore[no-any-return]

    monkeypatch.setattr(HealthReport, "parse", classmethod(counted))
    run_pass(unit, kube)
    assert parsed == Counter(texts.values())  # every node looked at, each report parsed once
    assert list(taints.rules or {}) == ["g1"]  # the DRA path ran on what the unit read
    assert kube.nodes["g1"]["metadata"]["labels"].get(HEALTH_STATE) == (
        hm.QUARANTINED if remediation else None
    )
