"""Every kind the operator watches is one row (controllers/watches.py's Watched), the indices the
startup handler takes are those rows, and the chart grants list and watch on each where the
operator watches it (cluster-wide for cluster-scoped kinds, the release namespace for the rest)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import lightkube.resources as lightkube_resources
import pytest
import yaml
from lightkube.core.resource import NamespacedResource
from lightkube.core.resource import Resource as LightkubeResource

from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.views import SERVICE_MONITOR
from gpu_operator.controllers.watches import Watched, Watches
from tests.support.chart import Rendered, find
from tests.support.permissions import covers, expand

CRDS = Path(__file__).resolve().parents[3] / "deployments" / "gpu-operator" / "crds"
# Kinds of other projects whose CRDs the chart does not carry: (group, plural) -> namespaced
# The Node reflector's kind: controllers/reflector.py watches it outside kopf (kube/nodewatch.py)
NODES = ("v1", "nodes")
FOREIGN_SCOPES = {
    ("nfd.k8s-sigs.io", "nodefeatures"): True,
    ("monitoring.coreos.com", "servicemonitors"): True,
}


def every_watch() -> Watches:
    """The registrations of a start on a cluster with every optional kind (ServiceMonitor's CRD,
    NFD's NodeFeatures), as the manager makes them."""
    watches = Watches(
        ReadModel("gpu-operator"), OperatorSettings(), lambda _: None, lambda _: None, lambda: None
    )
    watches.watch_owned(SERVICE_MONITOR)
    watches.watch_gfd_features()
    return watches


def group_plural(resource: tuple[str, ...]) -> tuple[str, str]:
    return ("", resource[1]) if len(resource) == 2 else (resource[0], resource[2])


def scopes() -> dict[tuple[str, str], bool]:
    """(group, plural) -> namespaced, from lightkube's models of Kubernetes' kinds and our CRDs."""
    out = dict(FOREIGN_SCOPES)
    for _, module in inspect.getmembers(lightkube_resources, inspect.ismodule):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            info = getattr(cls, "_api_info", None)
            if info is None or not issubclass(cls, LightkubeResource) or info.parent is not None:
                continue
            out[(info.resource.group, info.plural)] = issubclass(cls, NamespacedResource)
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        out[(crd["spec"]["group"], crd["spec"]["names"]["plural"])] = crd["spec"]["scope"] == "Namespaced"
    return out


def test_the_indices_taken_at_start_are_the_rows_registered() -> None:
    watches = every_watch()
    kopf_ids = {h.id for h in watches.registry._indexing.get_all_handlers()}
    assert kopf_ids == {w.index_id for w in watches.watched}
    assert len(watches.watched) == len({w.index_id for w in watches.watched})
    every: dict[str, Any] = {w.index_id: {} for w in watches.watched}
    watches._configure(kopf.OperatorSettings(), **every)
    assert set(watches.model.indices) == set(every)


def test_an_index_kopf_does_not_pass_stops_the_start() -> None:
    watches = every_watch()
    some: dict[str, Any] = {w.index_id: {} for w in watches.watched[1:]}
    with pytest.raises(kopf.PermanentError, match=watches.watched[0].index_id):
        watches._configure(kopf.OperatorSettings(), **some)


def ungranted(cluster_rules: list[dict[str, Any]], role_rules: list[dict[str, Any]], verb: str) -> list[str]:
    """The watched kinds on which the ClusterRole's rules (and, for namespaced kinds, the Role's) grant no `verb`."""
    cluster, namespaced = expand(cluster_rules), expand(role_rules)
    known = scopes()
    missing = []
    for row in [*every_watch().watched, Watched(NODES, "the Node reflector")]:
        group, plural = group_plural(row.resource)
        assert (group, plural) in known, (
            f"{group}/{plural}: scope unknown; add its CRD or a FOREIGN_SCOPES row"
        )
        held = cluster | namespaced if known[(group, plural)] else cluster
        if not covers(held, (group, plural, verb, None)):
            missing.append(f"{group or 'core'}/{plural} ({row.index_id})")
    return missing


@pytest.mark.parametrize("verb", ["list", "watch"])
def test_the_chart_grants_every_watched_kind_where_it_is_watched(
    render: Callable[..., Rendered], verb: str
) -> None:
    rendered = render()
    cluster, role = find(rendered, "ClusterRole")["rules"], find(rendered, "Role")["rules"]
    assert ungranted(cluster, role, verb) == [], f"watched but the chart grants no {verb}"


def test_a_missing_grant_is_found(render: Callable[..., Rendered]) -> None:
    """The check can fail: without configmaps in the Role, the owned ConfigMaps are named."""
    rendered = render()
    cluster, role = find(rendered, "ClusterRole")["rules"], find(rendered, "Role")["rules"]
    without = [{**r, "resources": [x for x in r["resources"] if x != "configmaps"]} for r in role]
    assert ungranted(cluster, without, "list") == ["core/configmaps (owned_configmaps)"]
