"""The apply/delete contract between the render result and the ClusterPolicy reconciler.

The renderer returns only what to apply (plus the kinds to keep and the states whose pods are
orphaned); the reconciler deletes what the policy owns and no longer renders. Every kind the
renderer can emit must be watched (or remembered by the reconciler), or it would be applied on
every reconcile and never deleted. The API behaviour itself is proven against the real control
plane in tests/integration/test_operator_apply_contract.py; here a recording stand-in for the
client shows which writes the reconciler decides on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator.controllers.apply import Applied, Applier, owner_reference
from gpu_operator.controllers.customresources import CLUSTER_POLICY
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.units.clusterpolicy.reconcile import ClusterPolicyReconciler
from gpu_operator.controllers.views import (
    ClusterPolicyView,
    NodeView,
    OwnedView,
)
from gpu_operator.controllers.watchedkinds import OWNED_KINDS, SERVICE_MONITOR
from gpu_operator.kube.client import ObjectKey
from gpu_operator.render import RenderResult, StateResult, render
from gpu_operator.vocabulary import STATE_LABEL
from tests.unit.render.renderkit import IMAGES, facts, nodes, policy

# Emitted only on OpenShift, which the operator does not detect yet: remembered, not watched.
REMEMBERED_ONLY = {"SecurityContextConstraints"}
EVERYTHING_ON = {
    "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"},
    "dcgmExporter": {"serviceMonitor": {"enabled": True}},
    "nodeStatusExporter": {"enabled": True},
    "gds": {"enabled": True},
    "gdrcopy": {"enabled": True},
    "vgpuDeviceManager": {"enabled": True},
    "ccManager": {"enabled": True},
    "kataManager": {"enabled": True},
    "mps": {"root": "/run/nvidia/mps"},
}


@pytest.mark.parametrize("openshift", [False, True])
@pytest.mark.parametrize("shapes", [("dgx-h100:2",), ("vfio-passthrough:1", "dgx-h100:1"), ("cpu:1",)])
def test_every_kind_the_renderer_emits_is_watched_or_remembered(
    openshift: bool, shapes: tuple[str, ...]
) -> None:
    watched = {k.kind for k in OWNED_KINDS} | {SERVICE_MONITOR.kind}
    for spec in ({}, EVERYTHING_ON, {"operator": {"use_ocp_driver_toolkit": False}, **EVERYTHING_ON}):
        result = render(policy(spec), facts(*shapes, openshift=openshift, servicemonitor_crd=True))
        emitted = {o["kind"] for o in result.objects()}
        assert emitted <= watched | REMEMBERED_ONLY, (
            f"add {emitted - watched} to OWNED_KINDS (controllers/watchedkinds.py)"
        )


class RecordingKube:
    """Stands in for Kube: records applies and deletes; what it holds is the live state."""

    def __init__(self) -> None:
        self.live: dict[Any, dict[str, Any]] = {}
        self.applies: list[str] = []
        self.deletes: list[tuple[str, bool]] = []

    async def apply(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        view = OwnedView.of({**obj, "metadata": {**meta, "uid": f"uid-{meta['name']}"}})
        self.live[view.key] = obj
        self.applies.append(str(ObjectKey.of(obj)))

    async def delete(self, key: ObjectKey, *, orphan: bool = False) -> bool:
        found = [k for k, o in self.live.items() if ObjectKey.of(o) == key]
        for k in found:
            del self.live[k]
        self.deletes.append((str(key), orphan))
        return bool(found)

    async def patch_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        pass

    async def get_dict(self, *_: Any, **__: Any) -> dict[str, Any] | None:
        return None

    async def list_dicts(
        self, api_version: str, kind: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            o for o in self.live.values() if o["kind"] == kind and o["metadata"].get("namespace") == namespace
        ]

    def owned(self, kinds: frozenset[str]) -> dict[Any, OwnedView]:
        views = [OwnedView.of(o) for o in self.live.values() if o["kind"] in kinds]
        return {v.key: v for v in views}


def snapshot(kube: RecordingKube, spec: dict[str, Any], watched: frozenset[str]) -> ReadSnapshot:
    body = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "uid": "policy-uid"},
        "spec": spec,
    }
    views = tuple(NodeView.of(n) for n in nodes("dgx-h100:1"))
    return ReadSnapshot(
        "gpu-operator",
        ClusterInfo("1.36.0", servicemonitor_crd=True),
        crs={CLUSTER_POLICY: (ClusterPolicyView("cluster-policy", "policy-uid", 1, "t", body),)},
        nodes=views,
        owned=kube.owned(watched),
        watched_kinds=watched,
    )


def test_unwatched_kind_is_applied_once_and_deleted_when_its_state_is_disabled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in IMAGES.items():
        monkeypatch.setenv(key, value)
    kube = RecordingKube()
    reconciler = ClusterPolicyReconciler(kube)  # type: ignore[arg-type]
    watched = frozenset(k.kind for k in OWNED_KINDS)  # ServiceMonitor not watched: remembered
    on = {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}
    asyncio.run(reconciler.reconcile(snapshot(kube, on, watched)))
    monitors = [a for a in kube.applies if a.startswith("ServiceMonitor ")]
    assert "ServiceMonitor gpu-operator/nvidia-dcgm-exporter" in monitors

    kube.applies.clear()
    asyncio.run(reconciler.reconcile(snapshot(kube, on, watched)))
    assert kube.applies == []  # nothing changed: nothing applied, the ServiceMonitor included

    asyncio.run(reconciler.reconcile(snapshot(kube, {}, watched)))
    assert ("ServiceMonitor gpu-operator/nvidia-dcgm-exporter", False) in kube.deletes
    assert not any(
        o["metadata"]["name"] == "nvidia-dcgm-exporter" and o["kind"] == "ServiceMonitor"
        for o in kube.live.values()
    )
    assert len(kube.deletes) == 1  # nothing else went: the remembered objects still rendered stay


def test_kept_kinds_and_foreign_objects_are_not_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in IMAGES.items():
        monkeypatch.setenv(key, value)
    kube = RecordingKube()
    reconciler = ClusterPolicyReconciler(kube)  # type: ignore[arg-type]
    watched = frozenset(k.kind for k in OWNED_KINDS)
    asyncio.run(reconciler.reconcile(snapshot(kube, {}, watched)))
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "users",
            "namespace": "gpu-operator",
            "ownerReferences": [{"uid": "someone-else", "controller": True}],
        },
    }
    kube.live[OwnedView.of(foreign).key] = foreign
    # The device plugin disabled: its objects go, the user's ConfigMap stays.
    kube.deletes.clear()
    asyncio.run(reconciler.reconcile(snapshot(kube, {"devicePlugin": {"enabled": False}}, watched)))
    deleted = {d for d, _ in kube.deletes}
    assert "DaemonSet gpu-operator/nvidia-device-plugin-daemonset" in deleted
    assert "ConfigMap gpu-operator/users" not in deleted


def _ds(name: str, state: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "gpu-operator", "labels": {STATE_LABEL: state}},
    }


def _scc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "security.openshift.io/v1",
        "kind": "SecurityContextConstraints",
        "metadata": {"name": name, "labels": {STATE_LABEL: "state-driver"}},
    }


def test_applier_keeps_kinds_orphans_marked_states_and_remembers_per_owner() -> None:
    """The one contract both reconcilers use, on hand-made results: `keep_kinds` spares a kind,
    `orphan_pods` deletes a state's DaemonSets with orphan propagation, unwatched kinds are
    remembered per owner (one owner's disabled SCC never touches another owner's)."""
    kube = RecordingKube()
    applier = Applier(kube)  # type: ignore[arg-type]
    watched = frozenset(k.kind for k in OWNED_KINDS)
    one = ClusterPolicyView("one", "uid-one", 1, "t", {})
    two = ClusterPolicyView("two", "uid-two", 1, "t", {})

    def run(
        owner: ClusterPolicyView, states: list[StateResult], keep: frozenset[str] = frozenset()
    ) -> Applied:
        done = Applied()
        asyncio.run(
            applier.apply(
                RenderResult(states, keep_kinds=keep),
                owner,
                owner_reference(owner),
                kube.owned(watched),
                watched,
                done,
            )
        )
        return done

    driver = StateResult("state-driver", True, "", [_ds("driver", "state-driver"), _scc("driver-scc")])
    plugin = StateResult("state-device-plugin", True, "", [_ds("plugin", "state-device-plugin")])
    assert len(run(one, [driver, plugin]).applied) == 3
    assert len(run(two, [StateResult("state-driver", True, "", [_scc("other-scc")])]).applied) == 1
    assert run(one, [driver, plugin]).applied == []  # hashes match; the SCC is remembered

    # DaemonSets kept: nothing goes although the plugin is no longer rendered.
    assert run(one, [driver], keep=frozenset({"DaemonSet"})).deleted == []
    # The driver handed over: its DaemonSet deleted with its pods orphaned, its SCC deleted, the
    # plugin DaemonSet deleted normally; the other owner's SCC untouched.
    handed_over = StateResult("state-driver", False, "", [], orphan_pods=True)
    done = run(one, [handed_over])
    assert sorted(done.deleted) == [
        "DaemonSet gpu-operator/driver (orphaning its pods)",
        "DaemonSet gpu-operator/plugin",
        "SecurityContextConstraints driver-scc",
    ]
    assert ("SecurityContextConstraints other-scc", False) not in kube.deletes
    assert run(one, [handed_over]).deleted == []  # nothing left to delete
