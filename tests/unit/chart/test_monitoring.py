"""The chart's alerts (PrometheusRule) and Grafana dashboard: every query parses as PromQL (the
promql-parser library, the grammar Prometheus itself uses), and every metric it reads is one our
operator or node-status exporter really exposes, or one of DCGM exporter's default counters."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from tests.support.chart import Rendered, find, objects

DATA = Path(__file__).parent / "data"
ON = {"monitoring": {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
SELECTOR_FIELDS = ("lhs", "rhs", "expr", "vector_selector", "param")


def metric_names(node: Any) -> Iterator[str]:
    """Every metric name a parsed PromQL expression selects."""
    if type(node).__name__ == "VectorSelector" and node.name:
        yield node.name
    for field in SELECTOR_FIELDS:
        child = getattr(node, field, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from metric_names(child)
    args = getattr(node, "args", None)
    if args is not None:
        for arg in getattr(args, "args", args):
            yield from metric_names(arg)


def exposed() -> set[str]:
    """Sample names our processes serve: the operator's registry and the node-status exporter."""
    from prometheus_client import REGISTRY

    import gpu_operator.controllers.metrics
    import gpu_operator.controllers.upgrade
    import gpu_operator.kube.client  # noqa: F401  (their metrics register on import)
    from gpu_operator.node.exporter import NodeStatusCollector
    from gpu_operator.node.hostfs import HostFS

    names = {f"{family.name}_total" if family.type == "counter" else family.name for family in REGISTRY.collect()}
    root = Path(__file__).parent  # any directory will do: the families are named the same
    collector = NodeStatusCollector(HostFS(str(root)), driver_check=lambda: True, plugin_devices=lambda: 1,
                                    clock=time.time)
    collector.plugin_last_success = collector.driver_last_success = 1.0
    names |= {family.name for family in collector.collect()}
    return names


def dcgm_defaults() -> set[str]:
    lines = (DATA / "dcgm-exporter-default-counters.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def queries(render: Callable[..., Rendered]) -> dict[str, str]:
    rendered = render(ON)
    rule = find(rendered, "PrometheusRule", "gpu-operator")
    out = {r["alert"]: r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]}
    dashboard = json.loads(find(rendered, "ConfigMap", "gpu-operator-dashboard")["data"]["gpu-operator.json"])
    out |= {panel["title"]: t["expr"] for panel in dashboard["panels"] for t in panel["targets"]}
    return out


def test_off_by_default(render: Callable[..., Rendered]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects(render())}
    assert ("PrometheusRule", "gpu-operator") not in kinds and ("ConfigMap", "gpu-operator-dashboard") not in kinds


def test_the_alerts_seed_004_asks_for_are_there(render: Callable[..., Rendered]) -> None:
    rule = find(render(ON), "PrometheusRule", "gpu-operator")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"GPUOperatorNotLeading", "GPUClusterPolicyNotReady", "GPUNodeValidationFailing",
                           "GPUDriverUpgradeFailed", "GPUXidErrors", "GPUFallenOffTheBus"}
    assert alerts["GPUClusterPolicyNotReady"]["for"] == "15m"
    assert "== 79" in alerts["GPUFallenOffTheBus"]["expr"]  # Xid 79: the GPU has fallen off the bus
    assert "{{ $labels.gpu }}" in alerts["GPUXidErrors"]["annotations"]["summary"]  # left for Prometheus
    longer = find(render({"monitoring": {"prometheusRule": {"enabled": True, "notReadyFor": "30m"}}}),
                  "PrometheusRule", "gpu-operator")
    assert {r["alert"]: r for g in longer["spec"]["groups"] for r in g["rules"]}["GPUClusterPolicyNotReady"]["for"] \
        == "30m"


def test_every_query_parses_and_reads_only_metrics_that_exist(render: Callable[..., Rendered]) -> None:
    found = queries(render)
    assert len(found) >= 20
    known = exposed() | dcgm_defaults()
    unknown: set[str] = set()
    for where, expr in found.items():
        try:
            parsed = promql_parser.parse(expr)
        except Exception as err:  # the parser's own error type is not exported
            pytest.fail(f"{where}: {expr!r} is not PromQL: {err}")
        names = set(metric_names(parsed))
        assert names, f"{where}: {expr!r} reads no metric"
        unknown |= {f"{where}: {n}" for n in names - known}
    assert unknown == set(), "metrics no exporter serves (rename, or add them to the exporter)"


def test_a_misspelt_metric_or_bad_query_is_caught() -> None:
    assert list(metric_names(promql_parser.parse("sum(rate(gpu_operator_reconcilation_total[5m]))"))) == [
        "gpu_operator_reconcilation_total"]
    assert "gpu_operator_reconcilation_total" not in exposed()
    with pytest.raises(Exception):  # noqa: B017 (the parser raises its own, unexported error type)
        promql_parser.parse("sum(rate(gpu_operator_reconciliation_total[5m])")
