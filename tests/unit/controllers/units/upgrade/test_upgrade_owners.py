"""Driver upgrades per owner: which owners a pass runs for (pure, controllers/units/upgrade/owners.py),
which driver pod each owner looks at, and one pass over two NVIDIADrivers against a fake
apiserver (lists read once, every step on the owner's own nodes)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pydantic
import pytest
from prometheus_client import REGISTRY

from gpu_operator.api.nvidiadriver import NVIDIADriverUpgradePolicy
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.controllers.units.upgrade.controller import (
    PassPod,
    UpgradeController,
    drivers_by_node,
    latest_revisions,
    pass_pods,
)
from gpu_operator.controllers.units.upgrade.owners import Owner, clusterpolicy_owner, upgrade_owners
from gpu_operator.controllers.views import (
    ClusterPolicyView,
    DriverPodView,
    NodeView,
    NVIDIADriverView,
)
from gpu_operator.kube.reads import Reads
from gpu_operator.vocabulary import DRIVER_OWNER, UPGRADE_PAUSED_ANNOTATION, UPGRADE_STATE

GPU = {"nvidia.com/gpu.present": "true"}
CRD_ON = {"driver": {"useNvidiaDriverCRD": True}}


def policy_view(
    kind: str, name: str, spec: dict[str, Any], *, paused: bool = False, deleting: bool = False
) -> Any:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if paused:
        meta["annotations"] = {UPGRADE_PAUSED_ANNOTATION: "true"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    api = "nvidia.com/v1alpha1" if kind == "NVIDIADriver" else "nvidia.com/v1"
    view = NVIDIADriverView if kind == "NVIDIADriver" else ClusterPolicyView
    return view.of({"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec})


def node(name: str, owner: str | None = None, state: str | None = None) -> NodeView:
    labels = dict(GPU)
    if owner:
        labels[DRIVER_OWNER] = owner
    if state:
        labels[UPGRADE_STATE] = state
    return NodeView.of(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )


def test_clusterpolicy_owner() -> None:
    body: dict[str, Any] = {
        "metadata": {"name": "cp", "uid": "u", "annotations": {UPGRADE_PAUSED_ANNOTATION: "true"}},
        "spec": {"driver": {"upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 3}}},
    }
    owner = clusterpolicy_owner(ClusterPolicyView.of(body))
    assert owner is not None and owner.paused and owner.policy.auto_upgrade and owner.policy.max_parallel == 3
    assert owner.nodes is None  # every node
    sandbox = clusterpolicy_owner(
        ClusterPolicyView.of({**body, "spec": {**body["spec"], "sandboxWorkloads": {"enabled": True}}})
    )
    assert sandbox is not None and not sandbox.policy.auto_upgrade
    # A spec the api model rejects owns nothing (its status names the field).
    assert (
        clusterpolicy_owner(
            ClusterPolicyView.of({**body, "spec": {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}}})
        )
        is None
    )


def test_without_the_crd_the_clusterpolicy_owns_every_node() -> None:
    cp = policy_view("ClusterPolicy", "cp", {"driver": {"upgradePolicy": {"autoUpgrade": True}}})
    (owner,) = upgrade_owners(cp, [policy_view("NVIDIADriver", "a", {})], [node("n1", "a")])
    assert (owner.name, owner.owner_uid, owner.nodes, owner.policy.auto_upgrade) == (
        "cp",
        "uid-cp",
        None,
        True,
    )
    assert upgrade_owners(None, [], [node("n1")]) == []
    bad = policy_view("ClusterPolicy", "cp", {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}})
    assert upgrade_owners(bad, [], []) == []


def test_with_the_crd_each_nvidiadriver_owns_its_labelled_nodes_with_its_own_policy_and_pause() -> None:
    cp = policy_view(
        "ClusterPolicy",
        "cp",
        {
            **CRD_ON,
            "driver": {**CRD_ON["driver"], "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 9}},
        },
    )
    drivers = [
        policy_view(
            "NVIDIADriver", "pool-b", {"nodeSelector": {"pool": "b"}, "upgradePolicy": {"autoUpgrade": False}}
        ),
        policy_view(
            "NVIDIADriver",
            "pool-a",
            {
                "nodeSelector": {"pool": "a"},
                "upgradePolicy": {"maxParallelUpgrades": 2, "maxUnavailable": 1, "drain": {"enable": True}},
            },
            paused=True,
        ),
        policy_view("NVIDIADriver", "plain", {"nodeSelector": {"pool": "c"}}),
        policy_view("NVIDIADriver", "bad", {"driverType": "cpu"}),
        policy_view("NVIDIADriver", "going", {"nodeSelector": {"pool": "d"}}, deleting=True),
    ]
    nodes = [
        node("a2", "pool-a"),
        node("a1", "pool-a"),
        node("b1", "pool-b"),
        node("d1", "going"),
        node("x1", "bad"),
        node("free", state=us.UPGRADE_DONE),
    ]
    owners = {o.name: o for o in upgrade_owners(cp, drivers, nodes)}
    assert sorted(owners) == ["plain", "pool-a", "pool-b"]  # the rejected and the deleted one own nothing
    a, b, plain = owners["pool-a"], owners["pool-b"], owners["plain"]
    assert a.nodes == frozenset({"a1", "a2"}) and b.nodes == frozenset({"b1"}) and plain.nodes == frozenset()
    assert a.owner_uid == "uid-pool-a" and a.paused and not b.paused
    assert (
        a.policy.auto_upgrade,
        a.policy.max_parallel,
        a.policy.max_unavailable,
        a.policy.drain_enable,
    ) == (
        True,
        2,
        1,
        True,
    )  # NVIDIADriver's autoUpgrade defaults to true; the ClusterPolicy's policy is not used
    assert not b.policy.auto_upgrade
    assert plain.policy == us.Policy.of(NVIDIADriverUpgradePolicy())
    views = {v.name: v for v in nodes}
    assert sorted(a.scope(views)) == ["a1", "a2"] and sorted(
        Owner("cp", a.policy, False, "u").scope(views)
    ) == sorted(views)


def driver_pod(name: str, node_name: str, ds_uid: str | None, hash_: str) -> dict[str, Any]:
    refs = [{"kind": "DaemonSet", "uid": ds_uid, "controller": True}] if ds_uid else []
    return {
        "metadata": {
            "name": name,
            "namespace": "ops",
            "labels": {"controller-revision-hash": hash_},
            "ownerReferences": refs,
        },
        "spec": {"nodeName": node_name},
        "status": {"phase": "Running", "containerStatuses": [{"ready": True, "restartCount": 0}]},
    }


def daemonset(uid: str, owner_uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ds-{uid}",
            "uid": uid,
            "ownerReferences": [{"uid": owner_uid, "controller": True}],
        },
        "spec": {"template": {"spec": {}}},
    }


def revision(ds_uid: str, number: int, hash_: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{ds_uid}-{hash_}",
            "labels": {"controller-revision-hash": hash_},
            "ownerReferences": [{"uid": ds_uid}],
        },
        "revision": number,
    }


DAEMONSETS = {"ds-a": daemonset("ds-a", "uid-pool-a"), "ds-b": daemonset("ds-b", "uid-pool-b")}
REVISIONS = [revision("ds-a", 1, "a-old"), revision("ds-a", 2, "a-new"), revision("ds-b", 1, "b-old")]


def test_latest_revisions_per_daemonset() -> None:
    assert latest_revisions(REVISIONS) == {"ds-a": "a-new", "ds-b": "b-old"}


def test_a_pod_of_another_owners_daemonset_is_neither_orphaned_nor_looked_at() -> None:
    pods = pass_pods(
        [
            DriverPodView.of(p)
            for p in (
                driver_pod("pa", "n1", "ds-a", "a-old"),
                driver_pod("pb", "n2", "ds-b", "b-old"),
                driver_pod("gone", "n3", "ds-deleted", "x"),
                driver_pod("none", "n4", None, "x"),
                driver_pod("unscheduled", "", "ds-a", "a-new"),
            )
        ],
        DAEMONSETS,
        latest_revisions(REVISIONS),
    )
    facts = {p.driver.name: p for p in pods}
    assert "unscheduled" not in facts
    assert (
        facts["pb"].owners == {"uid-pool-b"}
        and not facts["pb"].driver.orphaned
        and facts["pb"].driver.in_sync
    )
    assert facts["gone"].driver.orphaned and facts["none"].driver.orphaned
    assert not facts["pa"].driver.in_sync
    mine = drivers_by_node(pods, "uid-pool-a")
    assert {n: d.name for n, d in mine.items()} == {"n1": "pa", "n3": "gone", "n4": "none"}  # not pb
    # On one node, the owner's own pod wins over an orphaned one (the switch left it behind).
    new = us.DriverPod("new", "ops", in_sync=True)
    old = us.DriverPod("old", "ops", in_sync=False, orphaned=True)
    for order in (
        [PassPod("n", frozenset({"o"}), new), PassPod("n", frozenset(), old)],
        [PassPod("n", frozenset(), old), PassPod("n", frozenset({"o"}), new)],
    ):
        assert drivers_by_node(order, "o") == {"n": new}


def test_counts_are_summed_over_owners() -> None:
    assert us.total([us.Counts(3, 1, 1, 0, 1, 0), us.Counts(2, 0, 0, 1, 0, 1)]) == us.Counts(5, 1, 1, 1, 1, 1)
    assert us.total([]) == us.Counts()


class FakeKube(Reads):
    """An apiserver that answers the pass's lists (kube/reads.py's calls over a mock transport)
    and records node patches and events."""

    def __init__(
        self, daemonsets: list[dict[str, Any]], revisions: list[dict[str, Any]], pods: list[dict[str, Any]]
    ) -> None:
        self.lists: list[str] = []
        self.patches: dict[str, dict[str, Any]] = {}
        answers = {"daemonsets": daemonsets, "controllerrevisions": revisions, "pods": pods}

        def answer(request: httpx2.Request) -> httpx2.Response:
            self.lists.append(request.url.path.rsplit("/", 1)[-1])
            return httpx2.Response(
                200,
                json={"kind": "List", "metadata": {}, "items": answers[request.url.path.rsplit("/", 1)[-1]]},
            )

        self.mock = httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="https://apiserver")

    @property
    def http(self) -> httpx2.AsyncClient:
        return self.mock

    async def merge_patch(self, api_version: str, kind: str, name: str, patch: dict[str, Any]) -> None:
        assert name not in self.patches, f"{name} patched twice in one pass"
        self.patches[name] = patch

    async def node_event(self, *_: Any, **__: Any) -> None:
        return None


def test_one_pass_over_two_nvidiadrivers_lists_once_and_keeps_to_each_owners_nodes() -> None:
    cp = policy_view("ClusterPolicy", "cp", CRD_ON)
    drivers = [
        policy_view(
            "NVIDIADriver",
            "pool-a",
            {
                "nodeSelector": {"pool": "a"},
                "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
            },
        ),
        policy_view(
            "NVIDIADriver", "pool-b", {"nodeSelector": {"pool": "b"}, "upgradePolicy": {"autoUpgrade": False}}
        ),
    ]
    nodes = [
        node("a1", "pool-a", us.UPGRADE_REQUIRED),
        node("a2", "pool-a", us.UPGRADE_REQUIRED),
        node("a3", "pool-a"),
        node("a4", "pool-a"),
        node("b1", "pool-b", us.UPGRADE_DONE),
        node("b2", "pool-b"),
        node("stray", state=us.UPGRADE_REQUIRED),
    ]
    pods = [
        driver_pod("pa1", "a1", "ds-a", "a-old"),
        driver_pod("pa2", "a2", "ds-a", "a-old"),
        driver_pod("pa3", "a3", "ds-a", "a-new"),
        driver_pod("pb-on-a4", "a4", "ds-b", "b-old"),  # another owner's pod: not pool-a's to plan
        driver_pod("pb1", "b1", "ds-b", "b-old"),
        driver_pod("pb2", "b2", "ds-b", "b-old"),
        driver_pod("ps", "stray", "ds-a", "a-old"),
    ]
    kube = FakeKube(list(DAEMONSETS.values()), REVISIONS, pods)
    controller = UpgradeController(
        kube,  # type: ignore[arg-type]
        "ops",
        lambda: nodes,
        driver_pods=lambda: [DriverPodView.of(p) for p in pods],
    )
    owners = upgrade_owners(cp, drivers, nodes)

    async def one_pass() -> float:
        try:
            return (await controller.reconcile(owners)).requeue or 0.0
        finally:
            await kube.http.aclose()

    requeue = asyncio.run(one_pass())
    assert sorted(kube.lists) == [
        "controllerrevisions",
        "daemonsets",
    ]  # once per pass, not per owner; pods: watched
    states = {
        name: (p["metadata"].get("labels") or {}).get(UPGRADE_STATE, "-") for name, p in kube.patches.items()
    }
    # pool-a: one of its two waiting nodes starts (maxParallelUpgrades 1), the in-sync one is done
    assert states == {"a1": us.CORDON_REQUIRED, "a3": us.UPGRADE_DONE, "b1": None}, kube.patches
    # pool-b (autoUpgrade off) only loses its own state label; "stray" (no owner) is left alone
    assert requeue == controller.settings.upgrade_active_requeue
    gauges = {
        name: REGISTRY.get_sample_value(f"gpu_operator_nodes_upgrades_{name}")
        for name in ("pending", "in_progress", "done", "available")
    }
    assert gauges == {
        "pending": 2,
        "in_progress": 0,
        "done": 0,
        "available": 0,
    }  # pool-a's (its slot taken by a1)


def requeue_after_one_pass(
    driver: NVIDIADriverView, nodes: list[NodeView], pods: list[dict[str, Any]]
) -> tuple[float, dict[str, Any]]:
    cp = policy_view("ClusterPolicy", "cp", CRD_ON)
    kube = FakeKube(list(DAEMONSETS.values()), REVISIONS, pods)
    controller = UpgradeController(
        kube,  # type: ignore[arg-type]
        "ops",
        lambda: nodes,
        driver_pods=lambda: [DriverPodView.of(p) for p in pods],
    )

    async def one_pass() -> float:
        try:
            return (await controller.reconcile(upgrade_owners(cp, [driver], nodes))).requeue or 0.0
        finally:
            await kube.http.aclose()

    return asyncio.run(one_pass()), kube.patches


def test_nodes_held_in_upgrade_required_are_not_polled_and_a_started_one_is() -> None:
    nodes = [node("a1", "pool-a", us.UPGRADE_REQUIRED), node("a2", "pool-a", us.UPGRADE_REQUIRED)]
    pods = [driver_pod("pa1", "a1", "ds-a", "a-old"), driver_pod("pa2", "a2", "ds-a", "a-old")]
    policy = {
        "nodeSelector": {"pool": "a"},
        "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
    }
    paused = policy_view("NVIDIADriver", "pool-a", policy, paused=True)
    # Paused: nothing may start, and nothing changes with time; the next pass comes from an event
    # (the pause annotation removed) or the resync.
    requeue, patches = requeue_after_one_pass(paused, nodes, pods)
    assert patches == {} and requeue == OperatorSettings().upgrade_idle_requeue
    # Unpaused: a1 starts (cordon-required), a2 waits for its slot: passes every 2 s until done.
    requeue, patches = requeue_after_one_pass(policy_view("NVIDIADriver", "pool-a", policy), nodes, pods)
    assert list(patches) == ["a1"] and requeue == OperatorSettings().upgrade_active_requeue
    # a1 in progress, a2 still waiting: polled (a1's drain and pod restart move by time and pods).
    nodes[0] = node("a1", "pool-a", us.CORDON_REQUIRED)
    requeue, _ = requeue_after_one_pass(paused, nodes, pods)
    assert requeue == OperatorSettings().upgrade_active_requeue


def test_a_policy_view_is_parsed_once_and_keeps_the_models_refusal() -> None:
    good = policy_view("ClusterPolicy", "cp", {"driver": {"useNvidiaDriverCRD": True}})
    assert good.parsed is good.parsed  # one parse per object version, shared by the loops
    assert good.parsed.valid().spec.driver.useNvidiaDriverCRD is True
    bad = policy_view("ClusterPolicy", "cp", {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}})
    assert bad.parsed.model is None and bad.parsed.error is not None
    assert "maxParallelUpgrades" in str(bad.parsed.error)
    with pytest.raises(pydantic.ValidationError):
        bad.parsed.valid()
    assert upgrade_owners(bad, [], []) == []


def test_with_a_gpucluster_and_no_clusterpolicy_each_nvidiadriver_owns_its_nodes() -> None:
    drivers = [policy_view("NVIDIADriver", "pool-a", {"nodeSelector": {"pool": "a"}})]
    nodes = [node("a1", "pool-a"), node("free")]
    assert upgrade_owners(None, drivers, nodes) == []  # neither CR: nothing is upgraded
    (owner,) = upgrade_owners(None, drivers, nodes, dra=True)
    assert owner.name == "pool-a" and owner.nodes == frozenset({"a1"})


def test_each_pod_is_held_to_its_own_daemonsets_digest_within_one_pass() -> None:
    """A pass reads each DaemonSet's template digest once (not once a pod): a pod whose digest is
    its own DaemonSet's only restarts; the same digest against another DaemonSet's does not."""

    def with_digest(obj: dict[str, Any], digest: str, path: tuple[str, ...]) -> dict[str, Any]:
        spec = obj
        for key in path:
            spec = spec.setdefault(key, {})
        spec["containers"] = [{"name": "driver", "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": digest}]}]
        return obj

    template = ("spec", "template", "spec")
    daemonsets = {
        "ds-a": with_digest(daemonset("ds-a", "uid-pool-a"), "111", template),
        "ds-b": with_digest(daemonset("ds-b", "uid-pool-b"), "222", template),
    }
    pods = [
        with_digest(driver_pod(name, node, ds, "old"), digest, ("spec",))
        for name, node, ds, digest in (
            ("a1", "n1", "ds-a", "111"),
            ("b1", "n2", "ds-b", "111"),
            ("a2", "n3", "ds-a", "222"),
            ("b2", "n4", "ds-b", "222"),
        )
    ]
    facts = {p.driver.name: p for p in pass_pods([DriverPodView.of(p) for p in pods], daemonsets, {})}
    assert {name: f.driver.restart_only for name, f in facts.items()} == {
        "a1": True,
        "b1": False,
        "a2": False,
        "b2": True,
    }
    assert facts["a2"].owners == {"uid-pool-a"} and facts["b1"].owners == {"uid-pool-b"}
