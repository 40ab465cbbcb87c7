"""Every kind the operator watches: one table, the one place a watched kind is named.

A row says what the kind is (group, version, plural, kind), where it is watched (namespaced: in the
operator's namespace, as kopf is run; otherwise cluster-wide), the verbs its watch needs, the
`EventKind` its changes reach the units as, the kopf index that fills the read model, and the
start-up discovery fact without which it is not watched (its CRD served). Our CRs' rows are their
`CustomResource` rows (controllers/customresources.py), which answer the same fields.

Read from the table: the watches (controllers/watches.py) register each kopf row by its event
kind, the read model keeps each row's index, the chart tests hold the chart's grants to each row's
verbs where it is watched (tests/unit/chart/test_watched_kinds.py, test_chart_permissions.py), and
the apply contract's watched kinds are the owned rows (`OWNED_KINDS`). The Node and driver pod
reflectors (controllers/reflector.py) and the devicePlugin.config watch (kube/configwatch.py) watch
outside kopf; their rows are here for what they need of the chart."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from gpu_operator.controllers.customresources import CUSTOM_RESOURCES, WATCH_VERBS, CustomResource
from gpu_operator.controllers.loop import EventKind
from gpu_operator.vocabulary import NODE_FEATURE_GROUP, NODE_FEATURE_PLURAL, NODE_FEATURE_VERSION


class WatchedKind(NamedTuple):
    """One watched kind that is not one of our CRs (those are `CustomResource` rows)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool  # watched in the operator's namespace only (else cluster-wide)
    event: EventKind | None  # what its changes reach the units as; None: a NodeEvent
    index_id: str = ""  # the kopf index that fills the read model ("": not watched by kopf)
    needs: str = ""  # the ClusterInfo fact (its CRD served) without which it is not watched
    verbs: tuple[str, ...] = WATCH_VERBS

    @property
    def resource(self) -> tuple[str, str] | tuple[str, str, str]:
        """kopf's (group, version, plural), or (version, plural) for the core group."""
        return (self.group, self.version, self.plural) if self.group else (self.version, self.plural)


WatchRow = WatchedKind | CustomResource[Any]
"""A row of the table: a watched kind, or one of our CRs (whose rows answer the same fields but
`event`: `event_of`)."""


def event_of(row: WatchRow) -> EventKind | None:
    """What a row's changes reach the units as (our CRs': CUSTOM_RESOURCE events naming the row)."""
    return EventKind.CUSTOM_RESOURCE if isinstance(row, CustomResource) else row.event


def owned(
    group: str, version: str, plural: str, kind: str, *, namespaced: bool = True, needs: str = ""
) -> WatchedKind:
    """A kind the renderer emits, watched where it carries our managed-by label (`OWNED` events)."""
    return WatchedKind(group, version, plural, kind, namespaced, EventKind.OWNED, f"owned_{plural}", needs)


# Every kind the renderer can emit is watched (apply once, delete when no longer rendered), except
# SecurityContextConstraints (OpenShift only): remembered in memory by the applier
# (controllers/apply.py, Applier.remembered); ServiceMonitors only where their CRD is served.
OWNED_KINDS = (
    owned("apps", "v1", "daemonsets", "DaemonSet"),
    owned("", "v1", "serviceaccounts", "ServiceAccount"),
    owned("", "v1", "configmaps", "ConfigMap"),
    owned("", "v1", "services", "Service"),
    owned("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    owned("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    owned("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    owned("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    owned("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", namespaced=False),
    # the DRA driver's compute-domain controller (GPUCluster)
    owned("apps", "v1", "deployments", "Deployment"),
)
SERVICE_MONITOR = owned(
    "monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", needs="servicemonitor_crd"
)
# Driver pods (any owner, or none: the migration rule looks for orphaned ones), by their label: the
# driver pod reflector (controllers/reflector.py)
DRIVER_PODS = WatchedKind("", "v1", "pods", "Pod", True, EventKind.DRIVER_POD)
# GPU feature discovery's NodeFeatures, by node: node labelling mirrors their labels onto the Nodes.
GFD_FEATURES = WatchedKind(
    NODE_FEATURE_GROUP,
    NODE_FEATURE_VERSION,
    NODE_FEATURE_PLURAL,
    "NodeFeature",
    True,
    EventKind.GFD_FEATURES,
    "gfd_features",
    "node_feature_crd",
)
NODES = WatchedKind("", "v1", "nodes", "Node", False, None)  # the Node reflector (kube/nodewatch.py)
# The user's devicePlugin.config ConfigMap, by name (kube/configwatch.py)
PLUGIN_CONFIG = WatchedKind("", "v1", "configmaps", "ConfigMap", True, EventKind.PLUGIN_CONFIG)
FOREIGN_KINDS = (DRIVER_PODS, GFD_FEATURES, NODES, PLUGIN_CONFIG)


def watched_kinds(resources: Iterable[CustomResource[Any]] = CUSTOM_RESOURCES) -> tuple[WatchRow, ...]:
    """The table: our CRs' rows (`resources`), the owned kinds and the other projects' kinds."""
    return (*resources, *OWNED_KINDS, SERVICE_MONITOR, *FOREIGN_KINDS)


WATCHED_KINDS = watched_kinds()
