"""The chart's alerts evaluated by Prometheus's own rule engine: `promtool test rules` feeds the
series of data/alerts.test.yaml to the rendered PrometheusRule and compares the alerts that fire,
with their labels and annotations, at each time it names. promtool is Debian's build
(tools/promtool/get.sh says why not one from Go modules); GPU_OPERATOR_PROMTOOL names another."""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import Rendered, find

ROOT = Path(__file__).resolve().parents[3]
TESTS = Path(__file__).parent / "data" / "alerts.test.yaml"
ON = {"monitoring": {"prometheusRule": {"enabled": True}}}

# One change per alert that its tests must catch: (alert, text in its expr, replacement).
MUTATIONS = [
    ("GPUOperatorNotLeading", " or absent(gpu_operator_leader)", ""),
    ("GPUClusterPolicyNotReady", "< 1", "< 0"),
    ("GPUNodeValidationFailing", "== 0", "== 1"),
    ("GPUDriverUpgradeFailed", "> 0", ">= 0"),
    ("GPUNodeQuarantined", "quarantined|remediating|held", "quarantined"),
    ("GPURemediationFailed", '{state="failed"}) == 1 or ', '{state="failed"}) == 1 and '),
    ("GPUTemperatureHigh", "> 85", ">= 85"),
    ("GPUTemperatureCritical", "> 90", "> 92"),
    ("GPUFramebufferNearlyFull", "> 95", ">= 95"),
    ("GPUDoubleBitECCErrors", "[5m]", "[15m]"),
    ("GPUUncorrectableRowsRemapped", "increase(", "max_over_time("),
    ("GPURowRemapFailed", "> 0", "> 1"),
    ("GPUUtilizationHigh", "> 95", ">= 95"),
    ("GPUXidErrors", "[5m]", "[10m]"),
    ("GPUFallenOffTheBus", "== 79", "== 13"),
]
# The node label read from both names dcgm-exporter has given it (changed in every alert at once).
ALL = "every alert"
LABEL_MUTATIONS = [
    ('"Hostname", "(.+)"', '"Hostname_", "(.+)"'),
    ('"hostname", "(.+)"', '"hostname_", "(.+)"'),
]


@pytest.fixture(scope="module")
def promtool() -> str:
    if os.environ.get("GPU_OPERATOR_PROMTOOL"):
        return os.environ["GPU_OPERATOR_PROMTOOL"]
    got = subprocess.run([str(ROOT / "tools" / "promtool" / "get.sh")], capture_output=True, text=True)
    assert got.returncode == 0, f"tools/promtool/get.sh failed: {got.stderr}"
    return got.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def spec(render: Callable[..., Rendered]) -> dict[str, Any]:
    rule_spec: dict[str, Any] = find(render(ON), "PrometheusRule", "gpu-operator")["spec"]
    return rule_spec


def alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in spec["groups"] for r in group["rules"]}


def unit_tests(spec: dict[str, Any]) -> dict[str, Any]:
    """data/alerts.test.yaml with each expected alert's plain annotations filled in from its rule
    (the file writes the templated ones, as Prometheus should expand them)."""
    tests: dict[str, Any] = yaml.safe_load(TESTS.read_text())
    rules = alerts(spec)
    for group in tests["tests"]:
        for case in group["alert_rule_test"]:
            for expected in case["exp_alerts"]:
                written = expected.setdefault("exp_annotations", {})
                for key, text in rules[case["alertname"]]["annotations"].items():
                    if key not in written:
                        assert "{{" not in text, (
                            f"{case['alertname']}: write its expanded {key} in {TESTS.name}"
                        )
                        written[key] = text
    return tests


def dump(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=yaml.CSafeDumper, allow_unicode=True, width=1000)


def run_promtool(
    promtool: str, where: Path, spec: dict[str, Any], tests: str
) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` on `tests` (YAML text) against `spec` (the PrometheusRule's)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "rules.yaml").write_text(dump(spec))
    (where / "alerts.test.yaml").write_text(tests)
    return subprocess.run(
        [promtool, "test", "rules", "alerts.test.yaml"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_rules_load_in_prometheus(promtool: str, spec: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(dump(spec))
    checked = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_alert_is_tested_firing_and_quiet(spec: dict[str, Any]) -> None:
    cases = [case for group in unit_tests(spec)["tests"] for case in group["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert set(alerts(spec)) - fired == set(), "alerts no test sees firing"
    assert set(alerts(spec)) - quiet == set(), "alerts no test sees quiet"
    assert {case["alertname"] for case in cases} - set(alerts(spec)) == set(), (
        "tests of alerts the chart lacks"
    )


def test_the_alerts_fire_when_and_as_the_tests_say(
    promtool: str, spec: dict[str, Any], tmp_path: Path
) -> None:
    result = run_promtool(promtool, tmp_path, spec, dump(unit_tests(spec)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tests_catch_a_changed_alert(promtool: str, spec: dict[str, Any], tmp_path: Path) -> None:
    """Each alert changed a little, one at a time (threshold, window, state, label), fails the tests;
    so does every `for:` halved."""
    rules = alerts(spec)
    assert {alert for alert, _, _ in MUTATIONS} == set(rules), "one mutation per alert"
    # (alert or ALL, field, old text, new text): a field's `old` becomes `new`
    changes: list[tuple[str, str, str, str]] = []
    for alert, old, new in MUTATIONS:
        assert rules[alert]["expr"].count(old) == 1, (
            f"{alert}: {old!r} is not once in {rules[alert]['expr']!r}"
        )
        changes.append((alert, "expr", old, new))
    for alert, rule in rules.items():
        if "for" in rule:
            minutes = re.fullmatch(r"(\d+)m", rule["for"])
            assert minutes, f"{alert}: for {rule['for']!r}"
            changes.append((alert, "for", rule["for"], f"{int(minutes.group(1)) // 2}m"))
    changes += [(ALL, "expr", old, new) for old, new in LABEL_MUTATIONS]
    tests = dump(unit_tests(spec))  # the changes leave every annotation as it is

    def passes(n: int) -> bool:
        alert, field, old, new = changes[n]
        mutated = copy.deepcopy(spec)
        for name, rule in alerts(mutated).items():
            if alert in (name, ALL):
                rule[field] = rule[field].replace(old, new)
        return run_promtool(promtool, tmp_path / str(n), mutated, tests).returncode == 0

    # promtool mostly waits (about 1 s a run for 0.4 s of CPU): several at once
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(passes, range(len(changes))))
    survived = [
        f"{alert}: {field} {old!r} -> {new!r}"
        for (alert, field, old, new), ok in zip(changes, results, strict=True)
        if ok
    ]
    assert len(changes) >= len(MUTATIONS) + 9 + len(LABEL_MUTATIONS)
    assert survived == [], "changes the alert tests do not notice"


def _only_served(tests: dict[str, Any], served: set[str]) -> dict[str, Any]:
    """The alert tests with the DCGM series of fields outside `served` taken out: what Prometheus
    would scrape from an exporter that collects only those fields."""
    kept = copy.deepcopy(tests)
    for group in kept["tests"]:
        group["input_series"] = [
            s
            for s in group["input_series"]
            if not s["series"].startswith("DCGM_") or s["series"].split("{")[0] in served
        ]
    return kept


def test_every_alert_fires_on_what_the_charts_metrics_file_collects(
    promtool: str, spec: dict[str, Any], render: Callable[..., Rendered], tmp_path: Path
) -> None:
    """A default install's exporter collects the chart's metrics file (ConfigMap named by the
    ClusterPolicy): with only the DCGM series its fields produce, every alert test still passes;
    without one field an alert reads (the double-bit ECC counter), the tests fail."""
    from tests.unit.chart.test_monitoring import chart_metrics

    served = set(chart_metrics(render()))
    tests = unit_tests(spec)
    read = {s["series"].split("{")[0] for g in tests["tests"] for s in g["input_series"]}
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_GPU_TEMP"} <= read
    result = run_promtool(promtool, tmp_path / "served", spec, dump(_only_served(tests, served)))
    assert result.returncode == 0, result.stdout + result.stderr
    without = served - {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
    assert (
        run_promtool(promtool, tmp_path / "without", spec, dump(_only_served(tests, without))).returncode != 0
    )
