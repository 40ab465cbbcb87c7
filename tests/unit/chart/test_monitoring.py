"""The chart's alerts (PrometheusRule) and Grafana dashboard: every query parses as PromQL (the
promql-parser library, the grammar Prometheus itself uses), and every metric it reads is one our
operator or node-status exporter really exposes, or one of DCGM exporter's default counters (or one
the chart's own metrics file adds, docs/health.md). Each alert's threshold, `for:` and severity are checked as
data against the table below and docs/health.md's; test_alert_rules.py feeds them series."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from tests.support.chart import Rendered, find, objects

DATA = Path(__file__).parent / "data"
HEALTH_DOC = Path(__file__).resolve().parents[3] / "docs" / "health.md"
ON = {"monitoring": {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
SELECTOR_FIELDS = ("lhs", "rhs", "expr", "vector_selector", "param")
# DCGM counters the alerts read that dcgm-exporter's counters files leave commented out: the
# chart's own metrics file (files/dcgm-metrics.csv, its default) adds them (docs/health.md).
CHART_ADDED = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
# Every alert: severity, for (None: fires at once), the comparison that ends its expression, and
# the metrics it reads. Seed 004's thresholds: temperature > 85 warning, > 90 critical; framebuffer
# > 95 %; double-bit ECC; utilisation > 95 % for 30 min; Xid.
ALERTS: dict[str, tuple[str, str | None, str, float | None, set[str]]] = {
    "GPUOperatorNotLeading": ("critical", "5m", "or", None, {"gpu_operator_leader"}),
    "GPUClusterPolicyNotReady": ("warning", "15m", "<", 1, {"gpu_operator_reconciliation_status"}),
    "GPUNodeValidationFailing": ("warning", "10m", "==", 0, {"gpu_operator_node_driver_validation"}),
    "GPUDriverUpgradeFailed": ("warning", "5m", ">", 0, {"gpu_operator_nodes_upgrades_failed"}),
    "GPUNodeQuarantined": ("warning", "5m", "==", 1, {"gpu_operator_node_gpu_health"}),
    "GPURemediationFailed": (
        "critical",
        None,
        "or",
        None,
        {"gpu_operator_node_gpu_health", "gpu_operator_health_remediations_total"},
    ),
    "GPUTemperatureHigh": ("warning", "5m", ">", 85, {"DCGM_FI_DEV_GPU_TEMP"}),
    "GPUTemperatureCritical": ("critical", "2m", ">", 90, {"DCGM_FI_DEV_GPU_TEMP"}),
    "GPUFramebufferNearlyFull": ("warning", "5m", ">", 95, {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}),
    "GPUDoubleBitECCErrors": ("critical", None, ">", 0, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}),
    "GPUUncorrectableRowsRemapped": ("warning", None, ">", 0, {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"}),
    "GPURowRemapFailed": ("critical", None, ">", 0, {"DCGM_FI_DEV_ROW_REMAP_FAILURE"}),
    "GPUUtilizationHigh": ("info", "30m", ">", 95, {"DCGM_FI_DEV_GPU_UTIL"}),
    "GPUXidErrors": ("warning", None, ">", 0, {"DCGM_FI_DEV_XID_ERRORS"}),
    "GPUFallenOffTheBus": ("critical", None, "==", 79, {"DCGM_FI_DEV_XID_ERRORS"}),
}
# The labels an alert on DCGM exporter's series keeps: the node (from Hostname or hostname), the GPU,
# and a MIG instance's.
GPU_LABELS = ["node", "gpu", "UUID", "modelName", "GPU_I_PROFILE", "GPU_I_ID"]


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
    """Sample names our processes serve: the operator's registry (every module of its packages
    imported, so every metric it defines is registered) and the node-status exporter."""
    from prometheus_client import REGISTRY

    import gpu_operator.controllers
    import gpu_operator.kube
    from gpu_operator.node.exporter import NodeStatusCollector
    from gpu_operator.node.host.hostfs import HostFS

    for package in (gpu_operator.controllers, gpu_operator.kube):
        # every module, the unit folders' too (the manager imports them by name when it builds them)
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)
    names = {
        f"{family.name}_total" if family.type == "counter" else family.name for family in REGISTRY.collect()
    }
    root = Path(__file__).parent  # any directory will do: the families are named the same
    collector = NodeStatusCollector(
        HostFS(str(root)), driver_check=lambda: True, plugin_devices=lambda: 1, clock=time.time
    )
    collector.plugin_last_success = collector.driver_last_success = 1.0
    names |= {family.name for family in collector.collect()}
    return names


def dcgm_counters() -> tuple[set[str], set[str]]:
    """(served by default, known but commented out) in dcgm-exporter's counters files."""
    lines = (DATA / "dcgm-exporter-default-counters.txt").read_text().splitlines()
    on = {line.strip() for line in lines if line.startswith("DCGM_")}
    off = {line.split()[1] for line in lines if line.startswith("off ")}
    assert len(on) >= 20 and "DCGM_FI_DEV_GPU_TEMP" in on and on.isdisjoint(off)
    return on, off


def dcgm_defaults() -> set[str]:
    return dcgm_counters()[0]


def rules(render: Callable[..., Rendered]) -> dict[str, dict[str, Any]]:
    rule = find(render(ON), "PrometheusRule", "gpu-operator")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def queries(render: Callable[..., Rendered]) -> dict[str, str]:
    rendered = render(ON)
    rule = find(rendered, "PrometheusRule", "gpu-operator")
    out = {r["alert"]: r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]}
    dashboard = json.loads(find(rendered, "ConfigMap", "gpu-operator-dashboard")["data"]["gpu-operator.json"])
    out |= {panel["title"]: t["expr"] for panel in dashboard["panels"] for t in panel["targets"]}
    return out


def test_off_by_default(render: Callable[..., Rendered]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects(render())}
    assert ("PrometheusRule", "gpu-operator") not in kinds and (
        "ConfigMap",
        "gpu-operator-dashboard",
    ) not in kinds


def test_the_alerts_seed_004_asks_for_are_there(render: Callable[..., Rendered]) -> None:
    """Thresholds, `for:` and severities as data: the comparison that ends each expression, read
    from its parse tree."""
    alerts = rules(render)
    assert set(alerts) == set(ALERTS)
    for name, (severity, for_, op, threshold, metrics) in ALERTS.items():
        rule, parsed = alerts[name], promql_parser.parse(alerts[name]["expr"])
        assert (rule["labels"]["severity"], rule.get("for")) == (severity, for_), name
        assert isinstance(parsed, promql_parser.BinaryExpr) and str(parsed.op) == op, name
        if threshold is not None:
            assert isinstance(parsed.rhs, promql_parser.NumberLiteral) and parsed.rhs.val == threshold, name
        assert set(metric_names(parsed)) == metrics, name
        if all(m.startswith("DCGM_") for m in metrics):  # one alert per GPU, named by node and GPU
            assert isinstance(parsed.lhs, promql_parser.AggregateExpr) and parsed.lhs.modifier is not None
            assert parsed.lhs.modifier.labels == GPU_LABELS, name
    longer = find(
        render({"monitoring": {"prometheusRule": {"enabled": True, "notReadyFor": "30m"}}}),
        "PrometheusRule",
        "gpu-operator",
    )
    assert {r["alert"]: r for g in longer["spec"]["groups"] for r in g["rules"]}["GPUClusterPolicyNotReady"][
        "for"
    ] == "30m"


def chart_metrics(rendered: Rendered) -> dict[str, str]:
    """{DCGM field: Prometheus type} of the metrics file the rendered ClusterPolicy's exporter
    collects (the ConfigMap its dcgmExporter.config.name names, key dcgm-metrics.csv), read as
    dcgm-exporter reads it: comma-separated field, type, help; '#' lines and blank lines skipped."""
    name = find(rendered, "ClusterPolicy", "cluster-policy")["spec"]["dcgmExporter"]["config"]["name"]
    text = find(rendered, "ConfigMap", name)["data"]["dcgm-metrics.csv"]
    rows = [
        [cell.strip() for cell in line.split(",", 2)]
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert all(len(row) == 3 and row[2] for row in rows), "every line: field, type, help"
    assert len({row[0] for row in rows}) == len(rows), "a field listed twice"
    return {row[0]: row[1] for row in rows}


def test_the_charts_metrics_file_serves_every_dcgm_metric_read(render: Callable[..., Rendered]) -> None:
    """By default the exporter collects the chart's file: dcgm-exporter's own defaults, each with
    its type, plus exactly the counters the alerts read that those leave out (a documented deviation)."""
    on, off = dcgm_counters()
    served = chart_metrics(render())
    assert set(served) - {"DCGM_FI_DRIVER_VERSION"} >= on  # nothing the exporter's default served is lost
    assert served["DCGM_FI_DRIVER_VERSION"] == "label"
    assert set(served) - on - {"DCGM_FI_DRIVER_VERSION"} == CHART_ADDED and off >= CHART_ADDED
    assert {served[m] for m in CHART_ADDED} == {"counter"}
    assert all(served[m] in ("gauge", "counter") for m in on)
    read = {m for expr in queries(render).values() for m in metric_names(promql_parser.parse(expr))}
    assert {m for m in read if m.startswith("DCGM_")} - set(served) == set()
    assert {m for m in read if m.startswith("DCGM_")} - on == CHART_ADDED
    rows = {row["Alert"]: row for row in doc_table()}
    for name, (_, _, _, _, metrics) in ALERTS.items():
        expected = "added" if metrics & CHART_ADDED else "yes" if metrics <= on else "—"
        assert rows[name]["Exporter default"] == expected, name


def test_a_metrics_file_of_ones_own_replaces_the_charts(render: Callable[..., Rendered]) -> None:
    mine = render({"dcgmExporter": {"config": {"name": "my-metrics"}}})
    assert find(mine, "ClusterPolicy", "cluster-policy")["spec"]["dcgmExporter"]["config"] == {
        "name": "my-metrics"
    }
    assert [o for o in objects(mine) if o["metadata"]["name"] == "gpu-operator-dcgm-metrics"] == []
    image = render({"dcgmExporter": {"config": {"chartDefault": False}}})
    assert find(image, "ClusterPolicy", "cluster-policy")["spec"]["dcgmExporter"]["config"] == {"name": ""}
    assert [o for o in objects(image) if o["metadata"]["name"] == "gpu-operator-dcgm-metrics"] == []


def doc_table() -> list[dict[str, str]]:
    """docs/health.md's alerts table: one dict per row, its spans unwrapped."""
    lines = [line for line in HEALTH_DOC.read_text().splitlines() if line.startswith("|")]
    start = next(i for i, line in enumerate(lines) if line.split("|")[1].strip() == "Alert")
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        cells = [re.sub(r"`([^`]*)`", r"\1", cell.strip()) for cell in line.strip("|").split("|")]
        if len(cells) != len(header):
            break
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def test_the_docs_table_says_what_each_alert_does(render: Callable[..., Rendered]) -> None:
    alerts = rules(render)
    rows = {row["Alert"]: row for row in doc_table()}
    assert set(rows) == set(alerts)
    for name, row in rows.items():
        rule = alerts[name]
        assert row["Severity"] == rule["labels"]["severity"], name
        assert row["For"] == (rule.get("for") or "—"), name
        documented = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", row["Reads"]))
        assert documented == set(metric_names(promql_parser.parse(rule["expr"]))), name


def selectors(node: Any) -> Iterator[Any]:
    """Every vector selector of a parsed PromQL expression."""
    if type(node).__name__ == "VectorSelector":
        yield node
    for field in SELECTOR_FIELDS:
        child = getattr(node, field, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from selectors(child)
    args = getattr(node, "args", None)
    if args is not None:
        for arg in getattr(args, "args", args):
            yield from selectors(arg)


def test_the_health_alerts_match_the_operators_labels_and_states(render: Callable[..., Rendered]) -> None:
    """The GPU health alerts select the operator's health metrics by labels they have and by values
    those labels take (the states the operator sets, the results it counts)."""
    from gpu_operator.controllers.units.health.metrics import NODE_HEALTH, REMEDIATIONS
    from gpu_operator.controllers.units.health.rules import METRIC_STATES

    metrics = {
        "gpu_operator_node_gpu_health": (NODE_HEALTH, {"state": set(METRIC_STATES)}),
        "gpu_operator_health_remediations_total": (REMEDIATIONS, {"result": {"succeeded", "failed"}}),
    }
    alerts = rules(render)
    seen = set()
    for name in ("GPUNodeQuarantined", "GPURemediationFailed"):
        for selector in selectors(promql_parser.parse(alerts[name]["expr"])):
            metric, values = metrics[selector.name]
            for matcher in selector.matchers.matchers:
                chosen = set(matcher.value.split("|"))
                assert chosen <= values[matcher.name], f"{name}: {matcher.name}={matcher.value}"
                # the metric takes these labels (labels() refuses others); the child goes again at once
                for value in chosen:
                    labels = {"node": "alert-rule-test", matcher.name: value}
                    metric.labels(**labels)
                    metric.remove(*(labels[key] for key in ("node", matcher.name)))
                seen.add((selector.name, matcher.name))
    assert seen == {
        ("gpu_operator_node_gpu_health", "state"),
        ("gpu_operator_health_remediations_total", "result"),
    }


def test_every_query_parses_and_reads_only_metrics_that_exist(render: Callable[..., Rendered]) -> None:
    found = queries(render)
    assert len(found) >= 20
    known = exposed() | dcgm_defaults() | CHART_ADDED
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
        "gpu_operator_reconcilation_total"
    ]
    assert "gpu_operator_reconcilation_total" not in exposed()
    with pytest.raises(Exception):  # noqa: B017 (the parser raises its own, unexported error type)
        promql_parser.parse("sum(rate(gpu_operator_reconciliation_total[5m])")
