"""The apply/delete contract on the real control plane, for a kind that is not built in: with the
ServiceMonitor CRD installed before the operator starts, a ServiceMonitor is applied once (later
reconciles send no write for it, its resourceVersion stays) and deleted when its state turns it
off; a ServiceMonitor the operator did not create survives."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from operator import eq
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource, ServiceMonitorResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import MANAGED_BY, MANAGED_BY_VALUE
from tests.support.status import reconciled
from tests.support.waiting import wait_for

OPERATOR_USER = "gpu-operator-sim"
CRD_NAME = "servicemonitors.monitoring.coreos.com"
DCGM_MONITOR = "nvidia-dcgm-exporter"
# A small structural CRD for monitoring.coreos.com/v1 ServiceMonitor: the operator needs the kind
# to exist, not prometheus-operator's full schema.
SERVICEMONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                        },
                    }
                },
            }
        ],
    },
}


def _gone(kube: Client, name: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            kube.get(CustomResourceDefinition, name)
        except ApiError as err:
            return err.status.code == 404
        return False

    return check


@pytest.fixture
def servicemonitor_crd(kube: Client) -> Iterator[str]:
    """The ServiceMonitor CRD, established; removed (with every ServiceMonitor) after the test so
    the other tests keep a cluster without it."""
    kube.apply(CustomResourceDefinition.from_dict(SERVICEMONITOR_CRD), field_manager="test")  # type: ignore[call-overload]

    def established() -> bool:
        status = kube.get(CustomResourceDefinition, CRD_NAME).status
        return any(
            c.type == "Established" and c.status == "True" for c in (status.conditions or []) if status
        )

    wait_for("the ServiceMonitor CRD to be established", established, timeout=30)
    yield CRD_NAME
    kube.delete(CustomResourceDefinition, CRD_NAME)
    wait_for("the ServiceMonitor CRD to be removed", _gone(kube, CRD_NAME), timeout=60)


def _monitor(kube: Client, namespace: str, name: str) -> Any:
    try:
        return kube.get(ServiceMonitorResource, name, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def _writes(control_plane: ControlPlane, resource: str, name: str) -> list[tuple[str, str]]:
    """The operator's write requests on one object, from the apiserver's audit log."""
    return [
        (e.get("verb", ""), e.get("stage", ""))
        for e in control_plane.audit_events()
        if e.get("user", {}).get("username") == OPERATOR_USER
        and e.get("objectRef", {}).get("resource") == resource
        and e.get("objectRef", {}).get("name") == name
        and e.get("stage") == "ResponseComplete"
    ]


def _monitor_writes(control_plane: ControlPlane, name: str) -> list[tuple[str, str]]:
    return _writes(control_plane, "servicemonitors", name)


def _plugin_writes(control_plane: ControlPlane) -> int:
    return len(_writes(control_plane, "daemonsets", "nvidia-device-plugin-daemonset"))


def _plugin_env(kube: Client, namespace: str) -> dict[str, str]:
    try:
        ds = kube.get(DaemonSet, "nvidia-device-plugin-daemonset", namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return {}
        raise
    container = ds.spec.template.spec.containers[0]
    return {e.name: str(e.value) for e in container.env or []}


def test_servicemonitor_is_applied_once_and_deleted_when_disabled(
    kube: Client,
    control_plane: ControlPlane,
    servicemonitor_crd: str,
    operator_namespace: str,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
) -> None:
    fake_nodes("dgx-h100:1")
    # Not ours: carries our managed-by label (so the operator watches it) but no ownerReference.
    kube.create(
        ServiceMonitorResource.from_dict(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": {
                    "name": "users-monitor",
                    "namespace": operator_namespace,
                    "labels": {MANAGED_BY: MANAGED_BY_VALUE},
                },
                "spec": {"endpoints": [{"port": "metrics"}], "selector": {}},
            }
        )
    )
    operator = start_operator()
    cluster_policies({"dcgmExporter": {"serviceMonitor": {"enabled": True}}})
    reconciled(kube, context=operator.log_text)
    assert "ServiceMonitor CRD present" in operator.log_text()  # discovered at start-up
    created = wait_for(
        "the dcgm-exporter ServiceMonitor",
        lambda: _monitor(kube, operator_namespace, DCGM_MONITOR),
        context=operator.log_text,
    )
    version = created.metadata.resourceVersion
    assert created.metadata.ownerReferences[0].kind == "ClusterPolicy"
    writes_after_create = _monitor_writes(control_plane, DCGM_MONITOR)
    assert writes_after_create, "the audit log must show the ServiceMonitor's apply"

    # Two more reconciles that each change something else (the device plugin's env): the
    # ServiceMonitor is neither re-applied nor touched. A third change is the fence: the pass that
    # applies it starts after the second pass finished (the ServiceMonitor is applied after the
    # device plugin in a pass), and once its DaemonSet write is in the audit log, so is every
    # write of the passes before it.
    plugin_writes = _plugin_writes(control_plane)
    for value in ("one", "two", "fence"):
        kube.patch(
            ClusterPolicyResource,
            "cluster-policy",
            {"spec": {"devicePlugin": {"env": [{"name": "APPLY_ONCE_PROBE", "value": value}]}}},
            patch_type=PatchType.MERGE,
        )
        wait_for(
            f"the device plugin to carry APPLY_ONCE_PROBE={value}",
            lambda: _plugin_env(kube, operator_namespace).get("APPLY_ONCE_PROBE"),
            until=functools.partial(eq, value),
            context=operator.log_text,
        )
    wait_for(
        "the audit log to show the operator's three device plugin writes",
        lambda: _plugin_writes(control_plane),
        until=lambda n: n >= plugin_writes + 3,
        context=lambda: [
            (e.get("verb"), e.get("stage"), e.get("user", {}).get("username"), e.get("objectRef"))
            for e in control_plane.audit_events()
            if e.get("objectRef", {}).get("resource") == "daemonsets"
        ],
    )
    assert _monitor(kube, operator_namespace, DCGM_MONITOR).metadata.resourceVersion == version
    assert _monitor_writes(control_plane, DCGM_MONITOR) == writes_after_create

    # Disabled: deleted. The ServiceMonitor the operator did not create stays.
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"dcgmExporter": {"serviceMonitor": {"enabled": False}}}},
        patch_type=PatchType.MERGE,
    )
    wait_for(
        "the dcgm-exporter ServiceMonitor to be deleted",
        lambda: _monitor(kube, operator_namespace, DCGM_MONITOR) is None,
        context=operator.log_text,
    )
    assert ("delete", "ResponseComplete") in _monitor_writes(control_plane, DCGM_MONITOR)
    assert _monitor(kube, operator_namespace, "users-monitor") is not None
