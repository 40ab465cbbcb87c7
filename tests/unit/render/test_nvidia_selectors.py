"""Our operand DaemonSets carry NVIDIA's selectors, so each operator can apply over the other's.

A DaemonSet's selector cannot change (the apiserver refuses the update). NVIDIA's operator writes
its DaemonSets with update, so after a roll-back it fails on every pass on one of ours with another
selector; ours deleted such a DaemonSet (its pods orphaned) and created it again at a take-over.
With the same selectors neither happens (docs/migrate.md). The table is NVIDIA's, a fact of its
v26.7.0 assets (`assets/*/0*_daemonset.yaml`, `spec.selector.matchLabels`); the recorded fixtures of
its running operator hold the ones it deployed there. The table: tests/support/takeover.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import shapes
from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.render import render
from gpu_operator.render.clitext import label_gpu_nodes
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import ClusterFacts
from tests.support.takeover import NVIDIA_SELECTORS, PART_OF

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = [ROOT / "tests/fixtures/nvidia-v26.7.0", ROOT / "tests/fixtures/nvidia-v26.7.0-nvidiadriver"]


def _daemonsets(policy: dict[str, Any], shape: str) -> dict[str, dict[str, Any]]:
    nodes = shapes.nodes([f"{shape}:1"], settled=True)
    label_gpu_nodes(nodes)
    facts = ClusterFacts.from_nodes(
        nodes, namespace="gpu-operator", k8s_version="1.37.0", operator_env=dict(CHART_DEFAULT_IMAGES)
    )
    result = render(ClusterPolicy.model_validate(policy), facts)
    return {
        m["metadata"]["name"]: m
        for state in result.states
        for m in state.objects
        if m.get("kind") == "DaemonSet"
    }


def _example(name: str, **spec: Any) -> dict[str, Any]:
    """An example policy of ours (examples/clusterpolicy-<name>.yaml) with `spec` keys set over it."""
    policy: dict[str, Any] = yaml.safe_load((ROOT / f"examples/clusterpolicy-{name}.yaml").read_text())
    policy["spec"] = {**policy["spec"], **spec}
    return policy


def _every_operand_on() -> dict[str, dict[str, Any]]:
    """Every DaemonSet of ours that has a counterpart of NVIDIA's, over policies that enable them."""
    kata = {"enabled": True, "defaultWorkload": "vm-passthrough", "mode": "kata"}
    policies = [
        _example("default", nodeStatusExporter={"enabled": True}),
        _example("vm-passthrough"),
        _example("vm-vgpu"),
        _example("vm-passthrough", sandboxWorkloads=kata, ccManager={"enabled": True}),
    ]
    found: dict[str, dict[str, Any]] = {}
    for policy in policies:
        for shape in ("dgx-h100", "a10"):
            found.update(_daemonsets(policy, shape))
    return found


def test_every_daemonset_of_ours_with_nvidias_name_has_nvidias_selector() -> None:
    ours = _every_operand_on()
    both = sorted(set(ours) & set(NVIDIA_SELECTORS))
    wrong = {
        n: ours[n]["spec"]["selector"]["matchLabels"]
        for n in both
        if ours[n]["spec"]["selector"]["matchLabels"] != NVIDIA_SELECTORS[n]
    }
    assert not wrong, f"selectors unlike NVIDIA's: {wrong}"
    # the ones that differ from {app: <name>} are all rendered here (else the test proves nothing)
    assert {"gpu-feature-discovery", "nvidia-operator-validator", "nvidia-sandbox-validator"} <= set(both)
    assert {"nvidia-vfio-manager", "nvidia-cc-manager"} <= set(both)
    for name in both:  # each pod template matches its selector
        template = ours[name]["spec"]["template"]["metadata"]["labels"]
        assert NVIDIA_SELECTORS[name].items() <= template.items(), name
        assert template["app"] == name  # what our own code finds operand pods by


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_the_recorded_selectors_are_the_table(fixture: Path) -> None:
    recorded = {
        d["metadata"]["name"]: d["spec"]["selector"]["matchLabels"]
        for d in yaml.safe_load_all((fixture / "objects.yaml").read_text())
        if d and d.get("kind") == "DaemonSet" and d["metadata"]["name"] in NVIDIA_SELECTORS
    }
    assert recorded
    assert recorded == {name: NVIDIA_SELECTORS[name] for name in recorded}


def test_a_policy_label_never_breaks_a_selector() -> None:
    """spec.daemonsets.labels go onto every pod; one naming a selector key is left out."""
    policy = _example("vm-passthrough", daemonsets={"labels": {"name": "mine", PART_OF: "mine", "team": "a"}})
    vfio = _daemonsets(policy, "a10")["nvidia-vfio-manager"]
    labels = vfio["spec"]["template"]["metadata"]["labels"]
    assert labels["name"] == "nvidia-vfio-manager" and labels["team"] == "a"
