"""docs/health.md's Node Readiness Controller example works with what we write: the
NodeReadinessRule block is read from the page and checked against the controller's API
(kubernetes-sigs/node-readiness-controller api/v1alpha1: group readiness.node.x-k8s.io, version
v1alpha1, the spec's fields, enums and its CRD's rules on the taint key), its condition is our
NvidiaGPUReady at the status we write when a node is validated and healthy, and its taint key is
one spec.health.startupTaint accepts and the ClusterPolicy block on the same page names, which
every operand of that policy then tolerates."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.health import NodeReport
from gpu_operator.api.healthpolicy import READINESS_TAINT_PREFIX, StartupTaintSpec
from gpu_operator.controllers.units.health import rules as health_rules
from gpu_operator.render import render
from gpu_operator.vocabulary import HEALTH_CONDITION
from tests.support.docblocks import blocks
from tests.unit.render.renderkit import facts

PAGE = Path(__file__).resolve().parents[3] / "docs" / "health.md"

# The controller's API (api/v1alpha1/nodereadinessrule_types.go, groupversion_info.go)
GROUP_VERSION = "readiness.node.x-k8s.io/v1alpha1"
SPEC_REQUIRED = {"conditions", "enforcementMode", "taint", "nodeSelector"}
SPEC_FIELDS = SPEC_REQUIRED | {"conditionPolicy", "dryRun"}
CONDITION_FIELDS = {"type", "requiredStatus", "defaultStatus"}
STATUSES = {"True", "False", "Unknown"}
ENFORCEMENT = {"bootstrap-only", "continuous"}
EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
TAINT_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
SELECTOR_FIELDS = {"matchLabels", "matchExpressions"}


def _yaml_blocks() -> list[dict[str, Any]]:
    return [yaml.safe_load("\n".join(b.body)) for b in blocks(PAGE) if b.lang == "yaml"]


def _rule() -> dict[str, Any]:
    (rule,) = [d for d in _yaml_blocks() if isinstance(d, dict) and d.get("kind") == "NodeReadinessRule"]
    return rule


def _policy_block() -> dict[str, Any]:
    (block,) = [
        d
        for d in _yaml_blocks()
        if isinstance(d, dict) and "startupTaint" in (d.get("spec") or {}).get("health", {})
    ]
    return block


def rule_problems(rule: dict[str, Any]) -> list[str]:
    """What the controller's API (or its CRD's rules) would refuse in `rule`."""
    problems = []
    if rule.get("apiVersion") != GROUP_VERSION or rule.get("kind") != "NodeReadinessRule":
        problems.append(f"apiVersion/kind {rule.get('apiVersion')}/{rule.get('kind')}")
    spec = rule.get("spec") or {}
    problems += [f"spec.{f} missing" for f in sorted(SPEC_REQUIRED - set(spec))]
    problems += [f"spec.{f} unknown" for f in sorted(set(spec) - SPEC_FIELDS)]
    conditions = spec.get("conditions") or []
    if not 1 <= len(conditions) <= 32:
        problems.append("spec.conditions: 1 to 32")
    for i, condition in enumerate(conditions):
        problems += [f"spec.conditions[{i}].{f} unknown" for f in sorted(set(condition) - CONDITION_FIELDS)]
        if not condition.get("type") or condition.get("requiredStatus") not in STATUSES:
            problems.append(f"spec.conditions[{i}]: type and requiredStatus True/False/Unknown")
    if spec.get("enforcementMode") not in ENFORCEMENT:
        problems.append(f"spec.enforcementMode {spec.get('enforcementMode')!r}")
    taint = spec.get("taint") or {}
    key = str(taint.get("key", ""))
    prefix, _, name = key.partition("/")
    if (
        not key.startswith("readiness.k8s.io/")
        or key.count("/") != 1
        or not 1 <= len(name) <= 63
        or not TAINT_NAME.match(name)
        or len(key) > 253
        or not prefix
    ):
        problems.append(f"spec.taint.key {key!r}")
    if taint.get("effect") not in EFFECTS:
        problems.append(f"spec.taint.effect {taint.get('effect')!r}")
    if not set(spec.get("nodeSelector") or {"x": 1}) <= SELECTOR_FIELDS:
        problems.append("spec.nodeSelector: a label selector")
    return problems


def test_the_pages_rule_is_one_the_controllers_api_takes() -> None:
    assert rule_problems(_rule()) == []


def test_the_api_check_finds_what_the_controller_refuses() -> None:
    rule = _rule()
    spec = rule["spec"]
    for broken in (
        {**rule, "apiVersion": "readiness.k8s.io/v1"},
        {**rule, "spec": {**spec, "taint": {**spec["taint"], "key": "nvidia.com/gpu-ready"}}},
        {**rule, "spec": {**spec, "taint": {**spec["taint"], "effect": "Evict"}}},
        {**rule, "spec": {**spec, "enforcementMode": "once"}},
        {**rule, "spec": {k: v for k, v in spec.items() if k != "nodeSelector"}},
        {**rule, "spec": {**spec, "conditions": [{"type": HEALTH_CONDITION, "status": "True"}]}},
    ):
        assert rule_problems(broken), broken


def test_the_rule_waits_for_our_condition_at_the_status_of_a_healthy_validated_node() -> None:
    (condition,) = _rule()["spec"]["conditions"]
    assert condition["type"] == HEALTH_CONDITION
    report = json.dumps(
        {
            "v": 1,
            "validated": True,
            "state": "healthy",
            "action": "none",
            "healthy": 8,
            "gpus": [],
            "sources": ["kmsg", "pci"],
            "missing": [],
            "stopped": False,
        }
    )  # as the agent writes it
    healthy = health_rules.desire(health_rules.SignalFacts("gpu-0", NodeReport.of(report)), _spec_health())
    assert healthy.condition is not None and healthy.condition.status == condition["requiredStatus"]


def _spec_health() -> Any:
    policy = ClusterPolicy.model_validate({"metadata": {"name": "p"}, **_policy_block()})
    assert policy.spec.health is not None
    return policy.spec.health


def test_the_rules_taint_is_the_policys_startup_taint_and_every_operand_tolerates_it() -> None:
    key = _rule()["spec"]["taint"]["key"]
    assert key.startswith(READINESS_TAINT_PREFIX)
    assert StartupTaintSpec(key=key).key == key  # accepted as the operator's startup taint
    health = _spec_health()
    assert health.startupTaint.key == key and health.startupTaint.enabled is False  # the controller owns it
    policy = ClusterPolicy.model_validate({"metadata": {"name": "p"}, **_policy_block()})
    daemonsets = [o for o in render(policy, facts("dgx-h100:2")).objects() if o["kind"] == "DaemonSet"]
    assert daemonsets
    for ds in daemonsets:
        assert {"key": key, "operator": "Exists"} in ds["spec"]["template"]["spec"]["tolerations"]
