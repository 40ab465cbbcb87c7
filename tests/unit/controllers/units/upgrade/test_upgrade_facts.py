"""The upgrade controller's fact-gathering and patch-building helpers (pure parts of units/upgrade/controller.py)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gpu_operator.controllers import drain
from gpu_operator.controllers.clock import Clock
from gpu_operator.controllers.gpuholders import RuntimeAccess
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.upgrade import controller as upgrade
from gpu_operator.controllers.units.upgrade import owners as upgrade_owners
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.controllers.units.upgrade.controller import UpgradeController, node_patch, reflects
from gpu_operator.controllers.views import DriverPodView, NodeView
from gpu_operator.kube import pages
from gpu_operator.vocabulary import UPGRADE_DRAIN_SKIP_POD_LABEL, UPGRADE_STATE

DS_UID = "ds-1"


def ds(digest: str = "111") -> dict[str, Any]:
    return {
        "metadata": {"uid": DS_UID},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "driver", "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": digest}]}
                    ]
                }
            }
        },
    }


def driver_pod(hash_: str = "new", digest: str = "111", owned: bool = True, **status: Any) -> dict[str, Any]:
    refs = [{"kind": "DaemonSet", "uid": DS_UID, "controller": True}] if owned else []
    return {
        "metadata": {
            "name": "drv",
            "namespace": "ops",
            "labels": {"controller-revision-hash": hash_},
            "ownerReferences": refs,
        },
        "spec": {
            "containers": [{"name": "driver", "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": digest}]}]
        },
        "status": {"phase": "Running", "containerStatuses": [{"ready": True, "restartCount": 0}], **status},
    }


def test_driver_pod_in_sync_by_revision_hash() -> None:
    daemonsets, latest = {DS_UID: ds()}, {DS_UID: "new"}
    assert upgrade.driver_pod_facts(DriverPodView.of(driver_pod("new")), daemonsets, latest).in_sync
    old = upgrade.driver_pod_facts(DriverPodView.of(driver_pod("old")), daemonsets, latest)
    assert not old.in_sync and old.restart_only  # same digest: only the pod must restart
    changed = upgrade.driver_pod_facts(DriverPodView.of(driver_pod("old", digest="222")), daemonsets, latest)
    assert not changed.restart_only
    orphan = upgrade.driver_pod_facts(DriverPodView.of(driver_pod("new", owned=False)), daemonsets, latest)
    assert orphan.orphaned and not orphan.in_sync


def test_driver_pod_readiness_and_restarts() -> None:
    crashing = driver_pod(containerStatuses=[{"ready": False, "restartCount": 12}])
    facts = upgrade.driver_pod_facts(DriverPodView.of(crashing), {DS_UID: ds()}, {DS_UID: "new"})
    assert not facts.ready and facts.restarts == 12


def test_pod_facts() -> None:
    pod = {
        "metadata": {
            "name": "w",
            "namespace": "work",
            "labels": {UPGRADE_DRAIN_SKIP_POD_LABEL: "true"},
            "ownerReferences": [{"kind": "ReplicaSet", "controller": True}],
        },
        "spec": {
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
        "status": {"phase": "Running"},
    }
    facts = drain.pod_facts(pod, {"w"}, None, {("work", "w"): "work/pdb"}, access=RuntimeAccess(), claims={})
    assert (
        facts.gpu,
        facts.controlled,
        facts.daemonset,
        facts.empty_dir,
        facts.drain_skip,
        facts.wait_match,
        facts.drain_match,
        facts.blocked_by,
    ) == (True, True, False, True, True, True, True, "work/pdb")
    assert not drain.pod_facts(pod, set(), {"other"}, {}, access=RuntimeAccess(), claims={}).drain_match


def test_node_patch_is_one_merge_patch() -> None:
    step = us.UpgradeStep("n", state=us.CORDON_REQUIRED, annotations={"a": "1", "b": None}, cordon=True)
    assert upgrade.node_patch(step) == {
        "metadata": {"labels": {UPGRADE_STATE: us.CORDON_REQUIRED}, "annotations": {"a": "1", "b": None}},
        "spec": {"unschedulable": True},
    }
    assert upgrade.node_patch(us.UpgradeStep("n", remove_state=True)) == {
        "metadata": {"labels": {UPGRADE_STATE: None}}
    }


def test_pdb_name_from_refused_eviction() -> None:
    status = {
        "kind": "Status",
        "code": 429,
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget serve-pdb needs 1 healthy pods and has 1 currently",
                }
            ]
        },
    }
    assert pages.pdb_name(status) == "serve-pdb"
    assert pages.pdb_name({"code": 429}) == "?"


def _view(
    name: str, state: str | None = None, *, cordoned: bool = False, notes: dict[str, str] | None = None
) -> NodeView:
    labels = {UPGRADE_STATE: state} if state else {}
    return NodeView.of(
        {
            "metadata": {"name": name, "labels": labels, "annotations": notes or {}},
            "spec": {"unschedulable": cordoned},
        }
    )


def test_a_pass_waits_until_the_node_watch_shows_its_own_patches() -> None:
    """Planning on views older than our own writes could start more nodes than maxParallelUpgrades
    or send a step twice: the controller waits for the views, and after the lag limit goes on."""
    now = [100.0]
    controller = UpgradeController(
        None,  # type: ignore[arg-type]
        "ns",
        lambda: [],
        OperatorSettings(upgrade_view_lag_limit=0.2),
        driver_pods=lambda: [],
        clock=Clock(monotonic=lambda: now[0]),
    )
    step = us.UpgradeStep(
        "a", state=us.CORDON_REQUIRED, annotations={"nvidia.com/gpu-driver-upgrade-state-since": "5"}
    )
    controller.sent["a"] = node_patch(step)
    controller.sent["gone"] = node_patch(step)
    assert not controller.caught_up({"a": _view("a", us.UPGRADE_REQUIRED)})
    assert list(controller.sent) == ["a"]  # a node that is gone is not waited for
    assert not controller.caught_up({"a": _view("a", us.CORDON_REQUIRED)})  # the annotation is not there yet
    assert controller.caught_up(
        {"a": _view("a", us.CORDON_REQUIRED, notes={"nvidia.com/gpu-driver-upgrade-state-since": "5"})}
    )
    assert controller.sent == {}

    controller.sent["a"] = node_patch(us.UpgradeStep("a", cordon=True))
    assert not reflects(_view("a"), controller.sent["a"]) and reflects(
        _view("a", cordoned=True), controller.sent["a"]
    )
    removal = node_patch(us.UpgradeStep("a", remove_state=True))
    assert reflects(_view("a"), removal) and not reflects(_view("a", us.UPGRADE_DONE), removal)
    assert not controller.caught_up({"a": _view("a")})
    now[0] += 0.19
    assert not controller.caught_up({"a": _view("a")})  # within the limit: still waiting
    now[0] += 0.02
    assert controller.caught_up({"a": _view("a")})  # the watch lagged past the limit: plan anyway


def test_a_pass_waits_until_the_pod_watch_shows_the_driver_pods_it_deleted() -> None:
    """The driver pods come from the watch: a pass right after our delete would see the old pod
    live and delete it again; it waits until the watch shows it terminating or gone."""
    now = [100.0]
    controller = UpgradeController(
        None,  # type: ignore[arg-type]
        "ops",
        lambda: [],
        OperatorSettings(upgrade_view_lag_limit=0.2),
        driver_pods=lambda: [],
        clock=Clock(monotonic=lambda: now[0]),
    )
    live = DriverPodView.of(driver_pod())
    terminating = DriverPodView.of(
        {
            **driver_pod(),
            "metadata": {**driver_pod()["metadata"], "deletionTimestamp": "2026-11-23T00:00:00Z"},
        }
    )
    controller.deleted.add(("ops", "drv"))
    assert not controller.caught_up({}, {("ops", "drv"): live})
    assert controller.caught_up({}, {("ops", "drv"): terminating}) and not controller.deleted
    controller.deleted.add(("ops", "drv"))
    assert controller.caught_up({}, {}) and not controller.deleted  # gone
    controller.deleted.add(("ops", "drv"))
    assert not controller.caught_up({}, {("ops", "drv"): live})
    now[0] += 0.21  # past the lag limit, on the controller's clock
    assert controller.caught_up({}, {("ops", "drv"): live}) and not controller.deleted  # lagged: plan anyway


def _slim(pod: dict[str, Any]) -> dict[str, Any]:
    page = {"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": [pod]}
    (item,) = pages._decode_pods(json.dumps(page).encode()).items or []
    result: dict[str, Any] = msgspec.to_builtins(item)
    return result


def test_a_slim_decoded_validator_is_ready_by_its_containers_as_upstream() -> None:
    validator: dict[str, Any] = {
        "metadata": {"name": "v"},
        "spec": {"nodeName": "n1", "volumes": [{"name": "v", "hostPath": {}}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"ready": True, "image": "x"}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t"}],
        },
    }
    assert _slim(validator)["spec"]["nodeName"] == "n1" and "volumes" not in _slim(validator)["spec"]
    assert upgrade.validators_ready([_slim(validator)]) == {"n1": True}
    # its node missed heartbeats: the node lifecycle controller set Ready False, the containers
    # still run ready (upstream's validation reads them, and so do we)
    marked = {
        **validator,
        "status": {**validator["status"], "conditions": [{"type": "Ready", "status": "False"}]},
    }
    assert upgrade.validators_ready([_slim(marked)]) == {"n1": True}
    crashing = {
        **validator,
        "status": {"phase": "Running", "containerStatuses": [{"ready": True}, {"ready": False}]},
    }
    pending = {**validator, "status": {"phase": "Pending"}}
    other = {**validator, "spec": {"nodeName": "n2"}}  # another node's: its own answer
    assert upgrade.validators_ready([_slim(p) for p in (validator, crashing, pending, other)]) == {
        "n1": False,
        "n2": True,
    }


def test_a_driver_pods_view_keeps_what_the_upgrade_facts_read() -> None:
    pod = driver_pod("old", digest="222")
    view = DriverPodView.of({**pod, "spec": {**pod["spec"], "nodeName": "n1"}})
    assert (
        view.namespace,
        view.node,
        view.daemonset,
        view.revision,
        view.ready,
        view.restarts,
        view.deleting,
    ) == ("ops", "n1", DS_UID, "old", True, 0, False)
    assert view.digest == "222" and not view.orphaned
    gone = DriverPodView.of(
        {
            **driver_pod(),
            "metadata": {**driver_pod()["metadata"], "deletionTimestamp": "2026-11-23T00:00:00Z"},
        }
    )
    assert gone.deleting and upgrade.driver_pod_facts(gone, {DS_UID: ds()}, {DS_UID: "new"}).terminating


def test_validator_pods_are_listed_only_while_a_node_is_in_validation_required() -> None:
    import asyncio

    import httpx2

    from gpu_operator.kube.reads import Reads

    asked: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        asked.append(request.url.params.get("labelSelector", request.url.path))
        return httpx2.Response(200, json={"kind": "List", "metadata": {}, "items": []})

    async def one_pass(views: list[NodeView]) -> None:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer), base_url="https://apiserver")

        class Lists(Reads):  # kube/reads.py's calls over the mock apiserver
            @property
            def http(self) -> httpx2.AsyncClient:
                return http

        kube = Lists()
        controller = UpgradeController(kube, "ops", lambda: views, driver_pods=lambda: [])  # type: ignore[arg-type]
        policy = us.Policy(auto_upgrade=True)
        await controller.reconcile([upgrade_owners.Owner("cp", policy, False, "uid")])
        await http.aclose()

    asyncio.run(one_pass([_view("a", us.POD_RESTART_REQUIRED), _view("b", us.UPGRADE_DONE), _view("c")]))
    assert upgrade.VALIDATOR_SELECTOR not in asked
    assert all("pods" not in a for a in asked), asked  # driver pods come from the watch, never a list
    asked.clear()
    asyncio.run(one_pass([_view("a", us.VALIDATION_REQUIRED), _view("b")]))
    assert upgrade.VALIDATOR_SELECTOR in asked
