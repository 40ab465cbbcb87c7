"""The operator may change or delete a cluster-wide object only by name (deployments/gpu-operator/
templates/rbac.yaml): every RuntimeClass, DeviceClass and admission policy the renderer makes, for
any policy and any GPUCluster, must be named there, or the operator's apply of it is refused. Its
ClusterRoles and bindings (an NVIDIADriver's carry the CR's name) are held by the
gpu-operator-owned-rbac admission policy instead, which reads their managed-by label: every one the
renderer makes must carry it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import NAMESPACE, Rendered, find
from tests.support.permissions import expand
from tests.unit.chart.test_chart_permissions import POLICIES

# kind -> (API group, resource)
LABELLED_KINDS = ("ClusterRole", "ClusterRoleBinding")
OWNED_KINDS = {
    "RuntimeClass": ("node.k8s.io", "runtimeclasses"),
    "DeviceClass": ("resource.k8s.io", "deviceclasses"),
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io", "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
}
GPUCLUSTER = {
    "apiVersion": "nvidia.com/v1alpha1",
    "kind": "GPUCluster",
    "metadata": {"name": "gpu-cluster"},
    "spec": {
        "draDriver": {"featureGates": {"MPSSupport": True}},
        "dcgm": {"enabled": True},
        "dcgmExporter": {},
    },
}


def rendered(
    argv: list[str], tmp_path: Path, doc: dict[str, Any], namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """Every object `gpu-operator render ARGV <doc>` prints for the namespace (its JSON)."""
    path = tmp_path / "input.yaml"
    path.write_text(yaml.safe_dump(doc))
    argv = [
        sys.executable,
        "-m",
        "gpu_operator.cli",
        "render",
        *argv,
        str(path),
        "--namespace",
        namespace,
        "-o",
        "json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"gpu-operator render failed ({' '.join(argv[3:])}):\n{done.stderr}"
    parsed = json.loads(done.stdout)
    items: list[dict[str, Any]] = parsed["items"] if isinstance(parsed, dict) else parsed
    return items


def unnamed(role: dict[str, Any], objects: list[dict[str, Any]]) -> list[str]:
    """The objects of an owned kind whose patch or delete the ClusterRole does not allow by name."""
    held = expand(role["rules"])
    missing = []
    for obj in objects:
        if obj["kind"] in LABELLED_KINDS:
            if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") != "gpu-operator":
                missing.append(f"{obj['kind']} {obj['metadata']['name']} (label)")
            continue
        if obj["kind"] not in OWNED_KINDS:
            continue
        group, resource = OWNED_KINDS[obj["kind"]]
        for verb in ("patch", "delete"):
            if (group, resource, verb, obj["metadata"]["name"]) not in held:
                missing.append(f"{obj['kind']} {obj['metadata']['name']} ({verb})")
    return missing


@pytest.mark.parametrize("openshift", [False, True], ids=["kubernetes", "openshift"])
def test_every_cluster_wide_object_the_operator_renders_is_named_in_its_clusterrole(
    openshift: bool, render: Callable[..., Rendered], tmp_path: Path
) -> None:
    values: dict[str, Any] = {"platform": {"openshift": openshift}}
    role = find(render(values), "ClusterRole", "gpu-operator")
    flag = ["--openshift"] if openshift else []
    seen: set[str] = set()
    missing: list[str] = []
    for name, spec in {**POLICIES, "cdi": {"cdi": {"enabled": True}}}.items():
        policy = find(render({**values, **spec}), "ClusterPolicy", "cluster-policy")
        objs = rendered([*flag, "--shape", "dgx-h100:1", "--policy"], tmp_path, policy)
        seen |= {o["kind"] for o in objs}
        missing += [f"{name}: {m}" for m in unnamed(role, objs)]
    objs = rendered([*flag, "--gpucluster"], tmp_path, GPUCLUSTER)
    seen |= {o["kind"] for o in objs}
    missing += [f"GPUCluster: {m}" for m in unnamed(role, objs)]
    assert {*OWNED_KINDS, *LABELLED_KINDS} <= seen, f"a kind was never rendered: {set(OWNED_KINDS) - seen}"
    assert missing == [], "add these names to deployments/gpu-operator/templates/rbac.yaml:\n" + "\n".join(
        missing
    )


def test_the_runtimeclass_name_follows_the_value(render: Callable[..., Rendered], tmp_path: Path) -> None:
    values = {"operator": {"runtimeClass": "nvidia-custom"}}
    role = find(render(values), "ClusterRole", "gpu-operator")
    policy = find(render(values), "ClusterPolicy", "cluster-policy")
    objs = [
        o
        for o in rendered(["--shape", "dgx-h100:1", "--policy"], tmp_path, policy)
        if o["kind"] == "RuntimeClass"
    ]
    assert "nvidia-custom" in {o["metadata"]["name"] for o in objs}
    assert unnamed(role, objs) == []


def test_a_forgotten_name_is_caught(render: Callable[..., Rendered], tmp_path: Path) -> None:
    role = find(render(), "ClusterRole", "gpu-operator")
    for rule in role["rules"]:
        if "runtimeclasses" in rule["resources"] and rule.get("resourceNames"):
            rule["resourceNames"].remove("nvidia")
    policy = find(render(), "ClusterPolicy", "cluster-policy")
    objs = rendered(["--shape", "dgx-h100:1", "--policy"], tmp_path, policy)
    assert unnamed(role, objs) == ["RuntimeClass nvidia (patch)", "RuntimeClass nvidia (delete)"]
    unlabelled = [o for o in objs if o["kind"] == "ClusterRole"][:1]
    del unlabelled[0]["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert unnamed(role, unlabelled) == [f"ClusterRole {unlabelled[0]['metadata']['name']} (label)"]


def test_nvidiadriver_clusterroles_carry_the_label(render: Callable[..., Rendered], tmp_path: Path) -> None:
    """An NVIDIADriver's ClusterRole and binding are named after the CR: no list could hold them."""
    policy = find(render(), "ClusterPolicy", "cluster-policy")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    driver = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": "pool-a"},
        "spec": {"version": "580.82.07"},
    }
    objs = rendered(
        ["--shape", "dgx-h100:1", "--policy", str(tmp_path / "policy.yaml"), "--nvidiadriver"],
        tmp_path,
        driver,
    )
    roles = [o for o in objs if o["kind"] in LABELLED_KINDS]
    assert {o["metadata"]["name"] for o in roles} == {"nvidia-gpu-driver-pool-a"}
    role = find(render(), "ClusterRole", "gpu-operator")
    assert unnamed(role, objs) == []
