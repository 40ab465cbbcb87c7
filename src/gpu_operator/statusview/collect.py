"""Reads what the status view needs from any cluster's API (lightkube sync client) and builds it."""

from __future__ import annotations

from typing import Any

from httpx2 import HTTPStatusError
from lightkube import Client
from lightkube.operators import in_
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.kube.client import ClusterPolicyResource, GPUClusterResource
from gpu_operator.statusview.operatorpods import COMPONENT_LABEL, ROLES
from gpu_operator.statusview.table import StatusView, build_view, components_of


def _dicts(objs: Any) -> list[dict[str, Any]]:
    return [o.to_dict() if hasattr(o, "to_dict") else dict(o) for o in objs]


def list_policies(client: Client, resource: Any = ClusterPolicyResource) -> list[dict[str, Any]]:
    """ClusterPolicies (or GPUClusters); [] when their CRD is not installed (the apiserver then
    answers 404 with a plain-text body, which lightkube leaves an HTTPStatusError)."""
    try:
        return _dicts(client.list(resource))
    except HTTPStatusError as err:  # lightkube's ApiError is one too
        if err.response.status_code == 404:
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


def operator_pods(client: Client, namespace: str | None) -> list[dict[str, Any]]:
    """The chart's own pods (operator, CRD and cleanup hooks): in the namespace the user named,
    else in every namespace (one found from a policy's status or a DaemonSet need not be where
    a stuck operator is: an operator that never started wrote no status)."""
    try:
        return _dicts(client.list(Pod, namespace=namespace or "*",
                                  labels={COMPONENT_LABEL: in_(list(ROLES))}))
    except HTTPStatusError as err:
        if err.response.status_code == 403:  # a user who may read only the operand namespace
            return []
        raise


def collect(client: Client, namespace: str | None = None) -> StatusView:
    chart_pods = operator_pods(client, namespace)
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
    return build_view(nodes, daemonsets, pods, policies, namespace, clusters, chart_pods)
