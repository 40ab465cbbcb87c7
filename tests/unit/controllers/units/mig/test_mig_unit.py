"""The MIG unit against a recorded fake Kube: one write per change and none while nothing changes;
a node stuck in a MIG change gets a restore order, a condition naming the clients that did not
stop and one Event; after the backoff, with its clients back, its MIG manager pod is restarted;
an invalid config is reported with the valid names; a success forgets everything."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import yaml

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.loop import NodeEvent
from gpu_operator.controllers.settings import Backoff, OperatorSettings
from gpu_operator.controllers.units.mig import rules as mr
from gpu_operator.controllers.units.mig.unit import ECHO_WAIT, MIGPassReport, MIGUnit
from gpu_operator.controllers.views import NodeView
from gpu_operator.render.states.mig_manager import default_mig_config
from gpu_operator.vocabulary import (
    MIG_CONDITION,
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    MIG_MANAGER,
    MIG_PAUSED,
    MIG_PENDING_SINCE,
    MIG_RESTORE,
    MIG_RETRY,
    deploy_label,
)
from tests.unit.controllers.healthkit import FakeKube

NS = "gpu-operator"
DP = deploy_label("device-plugin")
GFD = deploy_label("gpu-feature-discovery")
SETTINGS = OperatorSettings(mig_change_budget=600.0, mig_retry_backoff=Backoff(initial=60.0, cap=600.0))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Model:
    """The part of the read model the unit reads."""

    kube: FakeKube
    policy: ClusterPolicy | None
    namespace: str = NS

    def active_model(self) -> ClusterPolicy | None:
        return self.policy

    def active_policy(self) -> Any:
        return SimpleNamespace(name="cluster-policy", uid="cp-uid") if self.policy is not None else None

    def nodes(self) -> list[NodeView]:
        return self.kube.views()

    def node(self, name: str) -> NodeView | None:
        return self.kube.view(name)


class Kube(FakeKube):
    """FakeKube with ConfigMaps (by name) beside its Nodes, and Events about other objects."""

    def __init__(self) -> None:
        super().__init__()
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.object_events: list[tuple[str, str, str, str]] = []

    async def event(
        self,
        involved: dict[str, str],
        reason: str,
        message: str,
        *,
        warning: bool = True,
        namespace: str = "default",
    ) -> None:
        self.calls.append(("event", involved["name"], reason))
        self.object_events.append((involved["kind"], involved["name"], reason, message))

    async def get_dict(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        if kind == "ConfigMap":
            self.calls.append(("get-configmap", name))
            return self.configmaps.get(name)
        return await super().get_dict(api_version, kind, name, namespace)


def policy(mig_manager: dict[str, Any] | None = None) -> ClusterPolicy:
    spec = {"migManager": mig_manager} if mig_manager is not None else {}
    return ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})


def make(kube: Kube, pol: ClusterPolicy | None = None, clock: Clock | None = None) -> MIGUnit:
    return MIGUnit(kube, SETTINGS, Model(kube, pol or policy()), clock=clock or Clock())  # type: ignore[arg-type]


def run_pass(unit: MIGUnit, kube: Kube) -> MIGPassReport:
    for name in list(kube.nodes):
        unit.wants(NodeEvent(name, kube.view(name)))
    result = asyncio.run(unit.reconcile())
    assert isinstance(result, MIGPassReport)
    return result


def mig_node(kube: Kube, name: str = "n1", **labels: str) -> None:
    kube.add_node(
        name, labels={MIG_MANAGER: "true", MIG_CONFIG: "all-1g.10gb", DP: "true", GFD: "true", **labels}
    )
    kube.add_pod(
        f"mig-manager-{name}",
        name,
        gpu=False,
        labels={"app": "nvidia-mig-manager"},
        namespace=NS,
        owner="DaemonSet",
    )


def condition(kube: Kube, name: str = "n1") -> tuple[str, str, str] | None:
    for c in kube.nodes[name]["status"]["conditions"]:
        if c["type"] == MIG_CONDITION:
            return c["status"], c["reason"], c["message"]
    return None


def ours(kube: Kube, name: str = "n1") -> dict[str, str]:
    return {
        k: v
        for k, v in kube.nodes[name]["metadata"]["annotations"].items()
        if k.startswith("nvidia.com/gpu-op")
    }


def pause(kube: Kube, name: str = "n1") -> None:
    kube.nodes[name]["metadata"]["labels"].update(
        {MIG_CONFIG_STATE: "pending", DP: MIG_PAUSED, GFD: MIG_PAUSED}
    )


def test_a_node_without_mig_costs_nothing() -> None:
    kube = Kube()
    kube.add_node("cpu", labels={"kubernetes.io/os": "linux"})
    report = run_pass(make(kube), kube)
    assert kube.writes() == [] and report.requeue is None


def test_applied_is_one_condition_then_nothing() -> None:
    kube = Kube()
    mig_node(kube, **{MIG_CONFIG_STATE: "success"})
    unit = make(kube)
    run_pass(unit, kube)
    assert condition(kube) == ("True", "MIGConfigApplied", "MIG config 'all-1g.10gb' applied")
    assert [c[0] for c in kube.writes()] == ["patch-status"]  # no Event: nothing to act on
    before = len(kube.writes())
    run_pass(unit, kube)  # the echo of its own write: nothing more
    assert len(kube.writes()) == before


def test_stuck_change_is_restored_reported_and_retried_after_the_backoff() -> None:
    kube, clock = Kube(), Clock()
    mig_node(kube)
    pause(kube)
    kube.add_pod("nvidia-dcgm-stuck", "n1", gpu=False, labels={"app": "nvidia-dcgm"}, namespace=NS)
    unit = make(kube, clock=clock)

    # in progress: first seen now, one annotation, one condition, in one request (nodes/status takes
    # metadata too), no Event (nothing to act on yet)
    report = run_pass(unit, kube)
    assert ours(kube) == {MIG_PENDING_SINCE: f"{int(clock.now)} all-1g.10gb"}
    assert [c[0] for c in kube.writes()] == ["patch-status"]
    assert condition(kube) is not None and condition(kube)[1] == "MIGChangeInProgress"  # type: ignore[index]
    assert kube.events == []
    assert report.requeue == SETTINGS.mig_poll  # looked at again within the poll (the budget is later)
    writes = len(kube.writes())
    run_pass(unit, kube)
    assert len(kube.writes()) == writes  # nothing changed: nothing written

    # past the budget: stuck; the order, the condition naming the client, one Warning event
    clock.now += 600
    run_pass(unit, kube)
    message = (
        "MIG config 'all-1g.10gb' pending past the 600 s budget: GPU clients that did not stop: "
        "gpu-operator/nvidia-dcgm-stuck; they are restored on the current layout and the change is retried"
    )
    assert condition(kube) == ("False", "MIGChangeStuck", message)
    assert ours(kube)[MIG_RESTORE] == f"MIGChangeStuck {message}"
    assert ours(kube)[MIG_RETRY] == f"0 {int(clock.now)}"
    assert kube.events[-1][1:] == ("MIGChange", f"MIGChangeStuck: {message}", True)
    # and on the ClusterPolicy (its status keeps upstream's shape)
    assert kube.object_events == [
        ("ClusterPolicy", "cluster-policy", "MIGChange", f"node n1: MIGChangeStuck: {message}")
    ]
    assert not any(c[0] == "delete" for c in kube.writes())  # labels still paused: no retry

    # node labelling restores the labels (it reads the order); still within the backoff: nothing
    kube.nodes["n1"]["metadata"]["labels"].update({DP: "true", GFD: "true"})
    writes = len(kube.writes())
    report = run_pass(unit, kube)
    assert len(kube.writes()) == writes and report.requeue == SETTINGS.mig_poll  # (the retry is due at 60 s)

    # the backoff passed: the MIG manager pod restarted, the order withdrawn, the attempt counted
    clock.now += 60
    run_pass(unit, kube)
    deletes = [c for c in kube.writes() if c[0] == "delete"]
    assert deletes == [("delete", f"{NS}/mig-manager-n1")]
    assert ours(kube) == {MIG_RETRY: f"1 {int(clock.now)}"}

    # the new MIG manager pauses again: a fresh change, in progress, no second retry
    kube.add_pod("mig-manager-n1-b", "n1", gpu=False, labels={"app": "nvidia-mig-manager"}, namespace=NS)
    pause(kube)
    run_pass(unit, kube)
    assert condition(kube)[1] == "MIGChangeInProgress"  # type: ignore[index]
    assert ours(kube)[MIG_PENDING_SINCE] == f"{int(clock.now)} all-1g.10gb"
    assert kube.events[-1][1:] == (
        "MIGChange",
        "MIGChangeInProgress: applying MIG config 'all-1g.10gb': state pending, GPU clients paused",
        False,
    )  # the stuck state ended: a Normal Event
    assert len(kube.events) == 2  # stuck, then its end

    # the client went, the change completed: applied, our memory gone
    kube.nodes["n1"]["metadata"]["labels"].update({MIG_CONFIG_STATE: "success", DP: "true", GFD: "true"})
    writes = len(kube.writes())
    run_pass(unit, kube)
    assert condition(kube) == ("True", "MIGConfigApplied", "MIG config 'all-1g.10gb' applied")
    assert ours(kube) == {}
    assert [c[0] for c in kube.writes()[writes:]] == [
        "patch-status"
    ]  # the condition and the clear: one request
    assert len([c for c in kube.writes() if c[0] == "delete"]) == 1


def test_paused_labels_left_by_a_mig_manager_that_will_not_come_back_are_restored_at_once() -> None:
    kube = Kube()
    mig_node(kube)
    pause(kube)
    kube.pods.clear()
    kube.nodes["n1"]["metadata"]["labels"][MIG_MANAGER] = "false"
    run_pass(make(kube), kube)
    assert condition(kube)[1] == "MIGManagerGone"  # type: ignore[index]
    assert MIG_RESTORE in ours(kube)


def test_invalid_config_names_the_valid_ones_from_our_configmap() -> None:
    kube = Kube()
    mig_node(kube, **{MIG_CONFIG: "all-9g.99gb", MIG_CONFIG_STATE: "failed"})
    run_pass(make(kube), kube)
    names = sorted(yaml.safe_load(default_mig_config())["mig-configs"])
    assert condition(kube) == (
        "False",
        "InvalidMIGConfig",
        "nvidia.com/mig.config 'all-9g.99gb' is not a config of ConfigMap "
        f"default-mig-parted-config; valid names: {', '.join(names)}",
    )
    assert not any(c[0] == "delete" for c in kube.writes())
    # the MIG manager's generated config (published per node) is the one it selects from
    kube.configmaps["n1-mig-config"] = {
        "data": {"config.yaml": "version: v1\nmig-configs:\n  all-9g.99gb: []\n"}
    }
    kube.nodes["n1"]["metadata"]["labels"][MIG_CONFIG_STATE] = "pending"
    unit = make(kube)
    run_pass(unit, kube)
    kube.nodes["n1"]["metadata"]["labels"][MIG_CONFIG_STATE] = "failed"
    run_pass(unit, kube)
    assert condition(kube)[1] == "MIGConfigFailed"  # type: ignore[index]


def test_the_policys_configmap_is_read_for_the_names() -> None:
    kube = Kube()
    kube.configmaps["my-layouts"] = {
        "data": {
            "config.yaml": json.dumps({"version": "v1", "mig-configs": {"b-layout": [], "a-layout": []}})
        }
    }
    mig_node(kube, **{MIG_CONFIG: "all-1g.10gb"})
    run_pass(make(kube, policy({"config": {"name": "my-layouts"}})), kube)
    assert condition(kube) == (
        "False",
        "InvalidMIGConfig",
        "nvidia.com/mig.config 'all-1g.10gb' is not a config "
        "of ConfigMap my-layouts; valid names: a-layout, b-layout",
    )
    assert ("get-configmap", "my-layouts") in kube.calls


def test_no_policy_writes_nothing() -> None:
    kube = Kube()
    mig_node(kube)
    pause(kube)
    unit = MIGUnit(kube, SETTINGS, Model(kube, None), clock=Clock())  # type: ignore[arg-type]
    run_pass(unit, kube)
    assert kube.writes() == []


def test_take_back_removes_our_condition_only_where_it_is() -> None:
    from gpu_operator.controllers.units.mig.unit import take_back

    kube = Kube()
    mig_node(kube, **{MIG_CONFIG_STATE: "success"})
    run_pass(make(kube), kube)
    assert condition(kube) is not None
    assert asyncio.run(take_back(kube, kube.nodes["n1"])) == ["removed condition NvidiaMIGReady"]  # type: ignore[arg-type]
    assert condition(kube) is None
    assert asyncio.run(take_back(kube, kube.nodes["n1"])) == []  # type: ignore[arg-type]


def test_the_operators_default_before_the_mig_manager_acted_costs_no_read() -> None:
    kube = Kube()
    for i in range(3):
        mig_node(kube, f"n{i}", **{MIG_CONFIG: "all-disabled"})
    run_pass(make(kube), kube)
    assert [c for c in kube.calls if c[0] == "get-configmap"] == []
    assert {condition(kube, f"n{i}")[1] for i in range(3)} == {"MIGChangeNotStarted"}  # type: ignore[index]


def test_a_restarted_operator_resumes_from_the_node_without_writing_again() -> None:
    """Everything the unit decides from is on the Node: a new unit (a restarted operator, another
    leader) writes nothing for a stuck node it already handled, and retries when the backoff is due."""
    kube, clock = Kube(), Clock()
    mig_node(kube)
    pause(kube)
    kube.add_pod("nvidia-dcgm-stuck", "n1", gpu=False, labels={"app": "nvidia-dcgm"}, namespace=NS)
    first = make(kube, clock=clock)
    run_pass(first, kube)
    clock.now += 600
    run_pass(first, kube)  # stuck: order, condition, Events
    kube.nodes["n1"]["metadata"]["labels"].update({DP: "true", GFD: "true"})  # node labelling restored them
    writes = len(kube.writes())
    second = make(kube, clock=clock)
    run_pass(second, kube)
    assert len(kube.writes()) == writes
    clock.now += 60
    run_pass(second, kube)
    assert [c for c in kube.writes()[writes:] if c[0] == "delete"] == [("delete", f"{NS}/mig-manager-n1")]


def test_a_failed_change_names_the_running_pods_given_gpus_of_any_namespace() -> None:
    kube = Kube()
    mig_node(kube, **{MIG_CONFIG_STATE: "failed"})
    kube.add_pod("train-0", "n1", namespace="team-a")  # given a GPU, running: holds it
    kube.add_pod("web-0", "n1", gpu=False, namespace="team-a")  # no GPU: not named
    kube.add_pod("nvidia-dcgm-x", "n1", gpu=False, labels={"app": "nvidia-dcgm"}, namespace="elsewhere")
    kube.configmaps["default-mig-parted-config"] = {"data": {"config.yaml": default_mig_config()}}
    run_pass(make(kube), kube)
    status, reason, message = condition(kube) or ("", "", "")
    assert (status, reason) == ("False", "MIGConfigFailed")
    # the one running holder named (not the pod without a GPU, nor a client-like pod of another namespace)
    expected = mr.failed_message(
        mr.MIGFacts(
            "n1", "all-1g.10gb", "failed", (), mr.ManagerPresence.RUNNING, holders=("team-a/train-0",)
        )
    )
    assert message == expected


def test_a_new_config_over_a_stale_success_writes_nothing_until_the_mig_manager_acts() -> None:
    kube, clock = Kube(), Clock()
    mig_node(kube, **{MIG_CONFIG: "all-disabled", MIG_CONFIG_STATE: "success"})
    unit = make(kube, clock=clock)
    run_pass(unit, kube)
    assert condition(kube) == ("True", "MIGConfigApplied", "MIG config 'all-disabled' applied")
    writes = len(kube.writes())

    # the label changed; the state still says success of all-disabled: no write, a look again within the poll
    kube.nodes["n1"]["metadata"]["labels"][MIG_CONFIG] = "all-1g.10gb"
    report = run_pass(unit, kube)
    assert len(kube.writes()) == writes and report.requeue == SETTINGS.mig_poll
    # the MIG manager starts: in progress, one request
    pause(kube)
    run_pass(unit, kube)
    assert condition(kube)[1] == "MIGChangeInProgress"  # type: ignore[index]
    assert len(kube.writes()) == writes + 1


def test_a_new_config_already_applied_is_reported_once_the_poll_passed() -> None:
    kube, clock = Kube(), Clock()
    mig_node(kube, **{MIG_CONFIG: "all-disabled", MIG_CONFIG_STATE: "success"})
    unit = make(kube, clock=clock)
    run_pass(unit, kube)
    kube.nodes["n1"]["metadata"]["labels"][MIG_CONFIG] = (
        "all-balanced"  # its success written again: no change
    )
    run_pass(unit, kube)
    assert condition(kube) == ("True", "MIGConfigApplied", "MIG config 'all-disabled' applied")
    clock.now += SETTINGS.mig_poll
    run_pass(unit, kube)
    assert condition(kube) == ("True", "MIGConfigApplied", "MIG config 'all-balanced' applied")


def test_a_decision_made_again_from_a_view_without_the_units_echo_is_not_written_twice() -> None:
    import copy

    kube, clock = Kube(), Clock()
    mig_node(kube, **{MIG_CONFIG_STATE: "pending"})  # the MIG manager wrote pending; its pause comes next
    stale = copy.deepcopy(kube.nodes["n1"])
    unit = make(kube, clock=clock)
    run_pass(unit, kube)
    writes = len(kube.writes())
    assert condition(kube)[1] == "MIGChangeInProgress"  # type: ignore[index]

    # the MIG manager's pause reaches the unit before the echo of its own write: the view lacks both
    stale["metadata"]["labels"].update({DP: MIG_PAUSED, GFD: MIG_PAUSED})
    view = NodeView.of(stale)
    unit.wants(NodeEvent("n1", view))
    unit.model.node = lambda name: view  # type: ignore[method-assign]
    asyncio.run(unit.reconcile())
    assert len(kube.writes()) == writes  # not written again
    # past the wait for the echo, a view still without it is written again
    clock.now += ECHO_WAIT
    unit.wants(NodeEvent("n1", view))
    asyncio.run(unit.reconcile())
    assert len(kube.writes()) == writes + 1


def test_a_success_after_the_change_moved_is_reported_at_once() -> None:
    kube, clock = Kube(), Clock()
    mig_node(kube, **{MIG_CONFIG: "all-disabled", MIG_CONFIG_STATE: "success"})
    unit = make(kube, clock=clock)
    run_pass(unit, kube)
    kube.nodes["n1"]["metadata"]["labels"][MIG_CONFIG] = "all-1g.10gb"
    pause(kube)
    run_pass(unit, kube)  # in progress
    kube.nodes["n1"]["metadata"]["labels"].update({MIG_CONFIG_STATE: "success", DP: "true", GFD: "true"})
    run_pass(unit, kube)
    assert condition(kube) == ("True", "MIGConfigApplied", "MIG config 'all-1g.10gb' applied")
