"""GPU health signals against the real apiserver: the health unit alone sets NvidiaGPUReady and
the quarantine taint from a report on a (kwok) Node, keeps them through the node's heartbeats,
takes them away when the report goes; the CRD refuses bad spec.health values naming the field."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.controllers.loop import NodeEvent
from gpu_operator.controllers.units.health.unit import HealthUnit
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube.client import Kube
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_REPORT_ANNOTATION, HEALTH_TAINT

XID79 = json.dumps(
    {
        "v": 1,
        "validated": True,
        "state": "unhealthy",
        "action": "reboot",
        "healthy": 0,
        "gpus": [
            {
                "bus": "0000:3b:00.0",
                "state": "unhealthy",
                "action": "reboot",
                "xid": 79,
                "reason": "GPU has fallen off the bus",
            }
        ],
        "sources": ["kmsg"],
    }
)


def _body(kube: Client, name: str) -> dict[str, Any]:
    return dict(kube.get(Node, name).to_dict())


def _condition(body: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == HEALTH_CONDITION), None
    )


def _taints(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list((body.get("spec") or {}).get("taints") or [])


def _passes(plane: ControlPlane, kube: Client, name: str, times: int) -> list[int]:
    """`times` passes of the unit, each fed the node as the watch would; the writes of each."""

    async def run() -> list[int]:
        api = Kube(str(plane.admin_kubeconfig))
        unit = HealthUnit(
            lambda: [NodeView.of(_body(kube, name))],
            lambda n: NodeView.of(_body(kube, n)),
            lambda: HealthSpec(),
            api,
        )
        counts = []
        try:
            for _ in range(times):
                unit.wants(NodeEvent(name, NodeView.of(_body(kube, name))))
                done = await unit.reconcile()
                counts.append(done.conditions + done.taints + done.events)  # type: ignore[attr-defined]
        finally:
            await api.close()
        return counts

    return asyncio.run(run())


def test_report_to_condition_and_taint_and_back(
    control_plane: ControlPlane, kube: Client, fake_nodes: Callable[..., list[str]]
) -> None:
    name = fake_nodes("a10:1")[0]
    kube.patch(
        Node,
        name,
        {
            "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
            "metadata": {"annotations": {HEALTH_REPORT_ANNOTATION: XID79}},
        },
    )
    assert _passes(control_plane, kube, name, 2) == [3, 0]  # condition, taint, Event; then nothing
    body = _body(kube, name)
    cond = _condition(body)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "GPUUnhealthy")
    assert [t["key"] for t in _taints(body)] == ["dedicated", HEALTH_TAINT]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in body["status"]["conditions"])
    time.sleep(3)  # kwok's node heartbeats keep our condition (conditions merge by type)
    assert _passes(control_plane, kube, name, 1) == [0]

    kube.patch(Node, name, {"metadata": {"annotations": {HEALTH_REPORT_ANNOTATION: None}}})
    assert _passes(control_plane, kube, name, 2) == [2, 0]  # condition removed, taint removed
    body = _body(kube, name)
    assert _condition(body) is None and [t["key"] for t in _taints(body)] == ["dedicated"]
    assert any(c["type"] == "Ready" for c in body["status"]["conditions"])


def test_the_crd_refuses_bad_health_values(control_plane: ControlPlane, crds: list[str]) -> None:
    def create(health: dict[str, Any]) -> list[str]:
        body = {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "health-bad-input"},
            "spec": {"health": health},
        }
        try:
            control_plane.request("POST", "/apis/nvidia.com/v1/clusterpolicies?dryRun=All", body)
        except urllib.error.HTTPError as err:
            status = json.loads(err.read() or b"{}")
            # ('<nil>': the apiserver's note that CEL rules were skipped on an invalid object)
            return [
                c.get("field", "")
                for c in status.get("details", {}).get("causes", [])
                if c.get("field", "") != "<nil>"
            ]
        return []

    assert create({"remediation": {"maxUnavailable": "lots"}}) == ["spec.health.remediation.maxUnavailable"]
    assert create({"remediation": {"maxUnavailable": "150%"}}) == ["spec.health.remediation.maxUnavailable"]
    assert create({"remediation": {"actions": ["reboot", "format-disk"]}}) == [
        "spec.health.remediation.actions[1]"
    ]
    assert create({"taintEffect": "PreferNoSchedule"}) == ["spec.health.taintEffect"]
    assert create({"remediation": {"maxUnavailable": "10%", "actions": ["reset-gpu", "reboot"]}}) == []
    assert create({"remediation": {"maxUnavailable": 2}}) == []
    assert create({"remediation": {"maxUnavailable": "2"}}) == []  # as the model reads it


def test_remediation_restarts_the_device_plugin_and_releases(
    control_plane: ControlPlane, kube: Client, fake_nodes: Callable[..., list[str]], namespace: str
) -> None:
    """quarantined -> draining (cordoned) -> acting (the device plugin's pod on the node deleted)
    -> validating -> the agent reports healthy -> released (uncordoned, untainted, condition True)."""
    from lightkube.resources.core_v1 import Pod

    from gpu_operator.controllers.units.health import machine as hm
    from gpu_operator.vocabulary import HEALTH_STATE

    name = fake_nodes("a10:1")[0]
    dp = Pod.from_dict(
        {
            "metadata": {
                "name": "dp",
                "namespace": namespace,
                "labels": {"app": "nvidia-device-plugin-daemonset"},
            },
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "registry.example/dp:1"}]},
        }
    )
    kube.create(dp)  # type: ignore[call-overload]
    sick = json.dumps(
        {
            "v": 1,
            "validated": True,
            "state": "unhealthy",
            "action": "restart-app",
            "healthy": 7,
            "gpus": [
                {
                    "bus": "0000:3b:00.0",
                    "state": "unhealthy",
                    "action": "restart-app",
                    "xid": 31,
                    "reason": "MMU fault",
                }
            ],
            "sources": ["kmsg"],
        }
    )
    kube.patch(Node, name, {"metadata": {"annotations": {HEALTH_REPORT_ANNOTATION: sick}}})
    policy = ClusterPolicy.model_validate({"spec": {"health": {"remediation": {"enabled": True}}}})

    async def run() -> list[tuple[str, bool]]:
        api = Kube(str(control_plane.admin_kubeconfig))
        unit = HealthUnit(
            lambda: [NodeView.of(_body(kube, name))],
            lambda n: NodeView.of(_body(kube, n)),
            lambda: policy.spec.health,
            api,
        )
        seen = []
        try:
            for _ in range(6):
                unit.wants(NodeEvent(name, NodeView.of(_body(kube, name))))
                await unit.reconcile()
                body = _body(kube, name)
                seen.append(
                    (
                        (body["metadata"].get("labels") or {}).get(HEALTH_STATE, ""),
                        bool(body["spec"].get("unschedulable")),
                    )
                )
                if seen[-1][0] == hm.VALIDATING:
                    # the validation of the validator pod the operator restarted with the plugin's
                    after = float(body["metadata"]["annotations"][hm.REVALIDATED]) + 1
                    healthy = json.dumps(
                        {
                            "v": 1,
                            "validated": True,
                            "state": "healthy",
                            "action": "none",
                            "healthy": 8,
                            "gpus": [],
                            "sources": ["kmsg"],
                            "validatedAt": after,
                        }
                    )
                    kube.patch(Node, name, {"metadata": {"annotations": {HEALTH_REPORT_ANNOTATION: healthy}}})
                if seen[-1][0] == "" and len(seen) > 1:
                    break
        finally:
            await api.close()
        return seen

    seen = asyncio.run(run())
    assert seen == [
        (hm.QUARANTINED, False),
        (hm.DRAINING, True),
        (hm.ACTING, True),
        (hm.VALIDATING, True),
        ("", False),
    ]
    left = {
        p.metadata.name: p.metadata.deletionTimestamp
        for p in kube.list(Pod, namespace=namespace)
        if p.metadata
    }
    assert "dp" not in left or left["dp"] is not None  # deleted (kwok may still be finishing it)
    body = _body(kube, name)
    cond = _condition(body)
    assert cond is not None and cond["status"] == "True"
    assert HEALTH_TAINT not in [t["key"] for t in _taints(body)]
