"""Reads what the status view needs from any cluster's API (lightkube sync client) and builds it."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.kube.client import ClusterPolicyResource, GPUClusterResource
from gpu_operator.statusview.table import StatusView, build_view, components_of


def _dicts(objs: Any) -> list[dict[str, Any]]:
    return [o.to_dict() if hasattr(o, "to_dict") else dict(o) for o in objs]


def list_policies(client: Client, resource: Any = ClusterPolicyResource) -> list[dict[str, Any]]:
    """ClusterPolicies (or GPUClusters); [] when their CRD is not installed."""
    try:
        return _dicts(client.list(resource))
    except ApiError as err:
        if err.status.code == 404:  # the CRD is not installed
            return []
        raise


def find_namespace(client: Client, policies: list[dict[str, Any]]) -> str | None:
    """Where the operands run: the policy's status.namespace, else where a deploy-gated DaemonSet is."""
    for policy in policies:
        namespace = (policy.get("status") or {}).get("namespace")
        if namespace:
            return str(namespace)
    for ds in _dicts(client.list(DaemonSet, namespace="*")):
        if components_of(ds):
            return str(ds["metadata"]["namespace"])
    return None


def collect(client: Client, namespace: str | None = None) -> StatusView:
    policies = list_policies(client)
    clusters = list_policies(client, GPUClusterResource)
    namespace = namespace or find_namespace(client, policies + clusters)
    nodes = _dicts(client.list(Node))
    daemonsets: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    if namespace:
        daemonsets = [ds for ds in _dicts(client.list(DaemonSet, namespace=namespace)) if components_of(ds)]
        if daemonsets:
            pods = _dicts(client.list(Pod, namespace=namespace))
    return build_view(nodes, daemonsets, pods, policies, namespace, clusters)
