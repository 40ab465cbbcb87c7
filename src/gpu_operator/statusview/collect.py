"""Reads what the status view needs from any cluster's API (lightkube sync client) and builds it."""

from __future__ import annotations

import time
from typing import Any

from httpx2 import HTTPStatusError
from lightkube import Client
from lightkube.operators import in_
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.kube.client import ClusterPolicyResource, GPUClusterResource
from gpu_operator.kube.crdowners import LeftCRD, left_crd
from gpu_operator.kube.crds import get_crd
from gpu_operator.kube.platform import PlatformError, platform_name, read_openshift_version_sync
from gpu_operator.statusview.operatorpods import COMPONENT_LABEL, ROLES
from gpu_operator.statusview.table import StatusView, build_view, components_of


def _dicts(objs: Any) -> list[dict[str, Any]]:
    return [o.to_dict() if hasattr(o, "to_dict") else dict(o) for o in objs]


# A CRD just created (the chart's hook made it a moment ago) is Established before the apiserver
# serves its objects: meanwhile a list answers 429 "storage is (re)initializing", for a second or so.
STORAGE_INIT_WAIT = 15.0


def list_policies(
    client: Client, resource: Any = ClusterPolicyResource, wait: float = STORAGE_INIT_WAIT
) -> list[dict[str, Any]]:
    """ClusterPolicies (or GPUClusters); [] when their CRD is not installed (the apiserver then
    answers 404 with a plain-text body, which lightkube leaves an HTTPStatusError). While the CRD's
    storage initialises (429) it asks again, for `wait` seconds at most."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return _dicts(client.list(resource))
        except HTTPStatusError as err:  # lightkube's ApiError is one too
            if err.response.status_code == 404:
                return []
            if err.response.status_code != 429 or time.monotonic() >= deadline:
                raise
        time.sleep(0.5)


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
        return _dicts(
            client.list(Pod, namespace=namespace or "*", labels={COMPONENT_LABEL: in_(list(ROLES))})
        )
    except HTTPStatusError as err:
        if err.response.status_code == 403:  # a user who may read only the operand namespace
            return []
        raise


def left_crds(client: Client) -> list[LeftCRD]:
    """The CRDs we ship that another Helm release owns (the CRD hook leaves them; kube/crdowners.py),
    each with what it lacks; [] for a user who may not read CRDs. Our chart never puts Helm's
    ownership marks on its CRDs, so any release they name is another one."""
    out = []
    try:
        for crd in load_packaged():
            decision = left_crd(get_crd(client, crd["metadata"]["name"]), crd, None)
            if decision is not None:
                out.append(decision)
    except HTTPStatusError as err:
        if err.response.status_code == 403:
            return []
        raise
    return out


def platform(client: Client) -> str:
    """ "OpenShift 4.17" where the cluster is one (the operator's own signal, kube/platform.py); ""
    elsewhere and for a user who may not read the ClusterVersion."""
    try:
        version = read_openshift_version_sync(client)
    except PlatformError:
        return "OpenShift (version unknown: no update has completed)"
    return platform_name(version) if version else ""


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
    view = build_view(nodes, daemonsets, pods, policies, namespace, clusters, chart_pods)
    view.crds = left_crds(client)
    view.platform = platform(client)
    view.problems += [crd.sentence() for crd in view.crds if not crd.compatible]
    return view
