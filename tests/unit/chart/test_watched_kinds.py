"""Every kind the operator watches is one row of one table (controllers/watchedkinds.py): kopf's
registrations are its rows, the indices the startup handler takes are theirs, each row's scope is
the kind's, and the chart's rendered ClusterRole (and, for a kind watched in the operator's
namespace, its Role) grants each row's verbs, list and watch among them."""

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

from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.watchedkinds import WATCHED_KINDS, WatchRow, event_of
from gpu_operator.controllers.watches import Watches
from tests.support.chart import Rendered, find
from tests.support.permissions import covers, expand

CRDS = Path(__file__).resolve().parents[3] / "deployments" / "gpu-operator" / "crds"
EVERY_CRD = ClusterInfo(servicemonitor_crd=True, node_feature_crd=True)


def every_watch() -> Watches:
    """The registrations of a start on a cluster with every optional kind's CRD served
    (ServiceMonitors, NFD's NodeFeatures), as the manager makes them."""
    watches = Watches(
        ReadModel("gpu-operator"), OperatorSettings(), lambda _: None, lambda _: None, lambda: None
    )
    watches.watch_discovered(EVERY_CRD, gfd_node_labels=True)
    return watches


def scopes() -> dict[tuple[str, str], bool]:
    """(group, plural) -> namespaced, from lightkube's models of Kubernetes' kinds and our CRDs."""
    out: dict[tuple[str, str], bool] = {}
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


def test_kopf_watches_the_tables_rows_and_takes_their_indices() -> None:
    watches = every_watch()
    kopf_rows = [row for row in WATCHED_KINDS if row.index_id]
    assert set(watches.watched) == set(kopf_rows) and len(watches.watched) == len(kopf_rows)
    kopf_ids = {h.id for h in watches.registry._indexing.get_all_handlers()}
    assert kopf_ids == {row.index_id for row in kopf_rows}
    assert len(kopf_rows) == len(kopf_ids)
    every: dict[str, Any] = {row.index_id: {} for row in kopf_rows}
    watches._configure(kopf.OperatorSettings(), **every)
    assert set(watches.model.indices) == set(every)


def test_a_row_that_needs_a_crd_is_watched_only_where_it_is_served() -> None:
    watches = every_watch()
    plain = Watches(
        ReadModel("gpu-operator"), OperatorSettings(), lambda _: None, lambda _: None, lambda: None
    )
    plain.watch_discovered(ClusterInfo(), gfd_node_labels=True)
    assert {row for row in watches.watched if row not in plain.watched} == {
        row for row in WATCHED_KINDS if row.needs
    }


def test_an_index_kopf_does_not_pass_stops_the_start() -> None:
    watches = every_watch()
    some: dict[str, Any] = {w.index_id: {} for w in watches.watched[1:]}
    with pytest.raises(kopf.PermanentError, match=watches.watched[0].index_id):
        watches._configure(kopf.OperatorSettings(), **some)


def test_each_rows_scope_is_its_kinds() -> None:
    """Where Kubernetes' or our CRDs say a kind's scope (other projects' CRDs are not here)."""
    known = scopes()
    wrong = [
        f"{row.group or 'core'}/{row.plural}"
        for row in WATCHED_KINDS
        if (row.group, row.plural) in known and known[(row.group, row.plural)] != row.namespaced
    ]
    assert wrong == []
    # a kind neither Kubernetes nor our CRDs define is watched only where discovery found its CRD
    # (and a misspelt built-in is caught here)
    assert [
        f"{r.group}/{r.plural}" for r in WATCHED_KINDS if (r.group, r.plural) not in known and not r.needs
    ] == []


def ungranted(cluster_rules: list[dict[str, Any]], role_rules: list[dict[str, Any]], verb: str) -> list[str]:
    """The rows whose `verb` (every row has list and watch) the ClusterRole's rules (and, for a row watched in the operator's
    namespace, the Role's) do not grant."""
    cluster, namespaced = expand(cluster_rules), expand(role_rules)
    missing = []
    for row in WATCHED_KINDS:
        held = cluster | namespaced if row.namespaced else cluster
        if verb in row.verbs and not covers(held, (row.group, row.plural, verb, None)):
            missing.append(label(row))
    return missing


def label(row: WatchRow) -> str:
    event = event_of(row)
    return f"{row.group or 'core'}/{row.plural} ({row.kind}, {event.value if event else 'node'} events)"


@pytest.mark.parametrize("verb", sorted({v for row in WATCHED_KINDS for v in row.verbs}))
def test_the_chart_grants_every_watched_kinds_verbs_where_it_is_watched(
    render: Callable[..., Rendered], verb: str
) -> None:
    rendered = render()
    cluster, role = find(rendered, "ClusterRole")["rules"], find(rendered, "Role")["rules"]
    assert ungranted(cluster, role, verb) == [], f"watched but the chart grants no {verb}"


def test_a_missing_grant_is_found(render: Callable[..., Rendered]) -> None:
    """The check can fail: without configmaps in the Role, both ConfigMap rows are named."""
    rendered = render()
    cluster, role = find(rendered, "ClusterRole")["rules"], find(rendered, "Role")["rules"]
    without = [{**r, "resources": [x for x in r["resources"] if x != "configmaps"]} for r in role]
    assert ungranted(cluster, without, "list") == [
        "core/configmaps (ConfigMap, owned events)",
        "core/configmaps (ConfigMap, devicePlugin.config ConfigMap events)",
    ]
