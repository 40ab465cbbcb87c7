"""Objects owned (by ownerReference uid) by one ClusterPolicy, NVIDIADriver or GPUCluster, across every kind the
operator applies: for checks that nothing was applied, or that everything is gone."""

from __future__ import annotations

from typing import Any

from lightkube import ALL_NS, Client
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, Service, ServiceAccount
from lightkube.resources.node_v1 import RuntimeClass
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding, Role, RoleBinding

from gpu_operator.controllers.watchedkinds import OWNED_KINDS

NAMESPACED = (DaemonSet, Deployment, ServiceAccount, ConfigMap, Service, Role, RoleBinding)
CLUSTER = (ClusterRole, ClusterRoleBinding, RuntimeClass)
assert {(k.__name__, k in NAMESPACED) for k in (*NAMESPACED, *CLUSTER)} == {
    (k.kind, k.namespaced) for k in OWNED_KINDS
}, "the kinds checked here differ from those the operator applies (controllers/watchedkinds.py OWNED_KINDS)"


def owned_by(kube: Client, uid: str | None) -> list[str]:
    """`Kind namespace/name` of every object with an ownerReference to `uid`."""
    found: list[str] = []
    for kind in (*NAMESPACED, *CLUSTER):
        listed: Any = kube.list(kind, namespace=ALL_NS) if kind in NAMESPACED else kube.list(kind)
        for obj in listed:
            if any(ref.uid == uid for ref in obj.metadata.ownerReferences or []):
                found.append(f"{kind.__name__} {obj.metadata.namespace or ''}/{obj.metadata.name}")
    return sorted(found)
