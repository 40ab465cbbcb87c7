"""The operator's RBAC in the chart equals, rule for rule, what the operator needs: its watches'
grants read from the table of watched kinds (controllers/watchedkinds.py), the rest listed here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.controllers.customresources import CUSTOM_RESOURCES
from gpu_operator.controllers.watchedkinds import WATCHED_KINDS
from tests.support.chart import NAMESPACE, Rendered, find, objects
from tests.support.permissions import Permission, covers, expand, grant

# What the operator does besides its watches; a watched kind's list and watch come from its row
# (`watches` below), so a verb listed here is needed for something else too (or is not a watch's).
# Server-side apply (authorized as patch, and as create when it creates) and deletes; never update.
WRITE = ("get", "create", "patch", "delete")
MANAGE = (*WRITE, "list", "watch")
# Cluster-wide kinds: create any (RBAC cannot name what a create makes), change or delete only what
# the operator renders, by name (test_chart_owned_names.py holds the names to the renderer).
MAKE = ("get", "list", "watch", "create")
OWN = ("patch", "delete")
RUNTIME_CLASSES = ("nvidia", "nvidia-cdi", "nvidia-legacy")
DEVICE_CLASSES = (
    "gpu.nvidia.com",
    "mig.nvidia.com",
    "vfio.gpu.nvidia.com",
    "compute-domain-daemon.nvidia.com",
    "compute-domain-default-channel.nvidia.com",
)
ADMISSION_POLICIES = ("resourceslices-policy-nvidia-dra-driver",)
LISTED_CLUSTER_WIDE: set[Permission] = (
    # the operator's own work: our CRs (one row each in controllers/customresources.py), their
    # status, and their finalizers (blockOwnerDeletion on what they own)
    set().union(
        *(
            grant(row.group, [row.plural], ["get", "patch"])
            | grant(row.group, [f"{row.plural}/status"], ["patch"])
            | grant(row.group, [f"{row.plural}/finalizers"], ["update"])
            for row in CUSTOM_RESOURCES
        )
    )
    | grant("resource.k8s.io", ["deviceclasses"], MAKE)
    | grant("resource.k8s.io", ["deviceclasses"], OWN, DEVICE_CLASSES)
    # GPU health on the DRA stack: a DeviceTaintRule per unhealthy GPU
    | grant("resource.k8s.io", ["devicetaintrules"], ["list", "create", "delete"])
    | grant(
        "admissionregistration.k8s.io",
        ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        MAKE,
    )
    | grant(
        "admissionregistration.k8s.io",
        ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        OWN,
        ADMISSION_POLICIES,
    )
    | grant("", ["nodes"], ["get", "patch"])
    | grant("", ["nodes/status"], ["patch"])  # GPU health: the NvidiaGPUReady condition
    | grant("", ["pods"], ["get", "list", "watch", "delete"])
    | grant("", ["pods/eviction"], ["create"])
    | grant("resource.k8s.io", ["resourceclaims"], ["get", "list", "watch"])  # drains, node labelling
    | grant("", ["events"], ["create"])
    | grant("events.k8s.io", ["events"], ["create", "patch"])
    | grant("node.k8s.io", ["runtimeclasses"], ["get", "create"])
    | grant("node.k8s.io", ["runtimeclasses"], OWN, RUNTIME_CLASSES)
    # (changed or deleted only when labelled as ours: the gpu-operator-owned-rbac admission policy)
    | grant("rbac.authorization.k8s.io", ["clusterroles", "clusterrolebindings"], WRITE)
    | grant("apiextensions.k8s.io", ["customresourcedefinitions"], ["get", "list", "watch"])
    | grant("", ["namespaces"], ["get", "patch"], [NAMESPACE])
    | grant("kubevirt.io", ["kubevirts"], ["get", "list", "patch"])
    # held only to hand on to operand ClusterRoles
    | grant("", ["nodes"], ["update"])
    | grant("apps", ["daemonsets"], ["get", "list", "watch"])
    | grant("config.openshift.io", ["clusterversions"], ["get", "list"])
    # ... to the DRA driver's roles (GPUCluster)
    | grant(
        "resource.k8s.io",
        ["resourceslices", "resourceclaimtemplates"],
        ["get", "list", "watch", "create", "update", "delete"],
    )
    | grant(
        "resource.nvidia.com",
        ["computedomains", "computedomains/status"],
        ["get", "list", "watch", "update", "patch"],
    )
    | grant(
        "resource.nvidia.com", ["computedomaincliques"], ["get", "list", "watch", "create", "update", "patch"]
    )
)
LISTED_IN_NAMESPACE: set[Permission] = (
    grant("apps", ["daemonsets", "deployments"], WRITE)
    | grant("apps", ["daemonsets", "deployments"], ["update"])
    | grant("apps", ["controllerrevisions"], ["get", "list", "watch"])
    | grant("", ["serviceaccounts", "configmaps", "services"], WRITE)
    | grant("rbac.authorization.k8s.io", ["roles", "rolebindings"], WRITE)
    | grant("resource.k8s.io", ["resourceclaimtemplates"], MANAGE)
    | grant("monitoring.coreos.com", ["servicemonitors"], WRITE)
    | grant("coordination.k8s.io", ["leases"], ["create"])
    | grant("coordination.k8s.io", ["leases"], ["get", "update", "delete"], ["53822513.nvidia.com"])
    | grant("coordination.k8s.io", ["leases"], ["get", "update"], ["nvidia-dra-driver-controller"])
    # held only to hand on to operand Roles
    | grant("", ["pods"], ["create", "patch"])  # the validator's workload pods; the IMEX daemon's own pod
    | grant("", ["configmaps"], ["update"])
    | grant("nfd.k8s-sigs.io", ["nodefeatures"], ["get", "list", "watch", "create", "update"])  # GFD's, here
    # GPU health remediation's requests: one Secret, written by the operator alone
    | grant("", ["secrets"], ["create"])
    | grant(
        "", ["secrets"], ["get", "list", "watch", "update", "patch", "delete"], ["nvidia-gpu-health-requests"]
    )
)


# Namespaced kinds whose watch the ClusterRole's listed rules serve (pods: listed for drains)
WATCHED_BY_CLUSTER_RULES = {("", "pods")}


def watches(namespaced: bool) -> set[Permission]:
    """The grants the watches need, one row's verbs each: a cluster-scoped row's in the
    ClusterRole, one watched in the operator's namespace in its Role."""
    return {
        permission
        for row in WATCHED_KINDS
        if row.namespaced == namespaced and (row.group, row.plural) not in WATCHED_BY_CLUSTER_RULES
        for permission in grant(row.group, [row.plural], row.verbs)
    }


CLUSTER_WIDE = LISTED_CLUSTER_WIDE | watches(namespaced=False)
IN_NAMESPACE = LISTED_IN_NAMESPACE | watches(namespaced=True)
OPENSHIFT_CLUSTER_WIDE: set[Permission] = (
    grant("config.openshift.io", ["proxies"], ["get", "list", "watch"])
    | grant("image.openshift.io", ["imagestreams"], ["get", "list", "watch"])
    | grant("security.openshift.io", ["securitycontextconstraints"], (*MANAGE, "use"))
)
OPENSHIFT_IN_NAMESPACE: set[Permission] = grant("monitoring.coreos.com", ["prometheusrules"], MANAGE) | grant(
    "", ["endpoints"], ["get", "list", "watch"]
)


def operator_rules(rendered: Rendered) -> tuple[set[Permission], set[Permission]]:
    return (
        expand(find(rendered, "ClusterRole", "gpu-operator")["rules"]),
        expand(find(rendered, "Role", "gpu-operator")["rules"]),
    )


def test_chart_grants_exactly_the_listed_permissions(render: Callable[..., Rendered]) -> None:
    cluster, namespaced = operator_rules(render())
    assert sorted(cluster - CLUSTER_WIDE, key=str) == [], "granted but not listed as needed"
    assert sorted(CLUSTER_WIDE - cluster, key=str) == [], "needed but not granted"
    assert namespaced == IN_NAMESPACE


def test_openshift_adds_only_the_openshift_rules(render: Callable[..., Rendered]) -> None:
    cluster, namespaced = operator_rules(render({"platform": {"openshift": True}}))
    assert cluster == CLUSTER_WIDE | OPENSHIFT_CLUSTER_WIDE
    assert namespaced == IN_NAMESPACE | OPENSHIFT_IN_NAMESPACE


def test_no_wildcards_and_no_privilege_escalation_verbs(render: Callable[..., Rendered]) -> None:
    for openshift in (False, True):
        rendered = render({"platform": {"openshift": openshift}})
        assert any(o["kind"] in ("ClusterRole", "Role") for o in objects(rendered))
        for obj in objects(rendered):
            if obj["kind"] not in ("ClusterRole", "Role"):
                continue
            for rule in obj["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
                # escalate/bind would let the operator grant itself anything (docs/helm.md)
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
                if obj["kind"] == "ClusterRole":
                    assert "secrets" not in rule["resources"], rule


def test_a_missing_rule_is_caught(render: Callable[..., Rendered]) -> None:
    rendered = render()
    role = find(rendered, "ClusterRole", "gpu-operator")
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["pods/eviction"]]
    assert CLUSTER_WIDE - expand(role["rules"]) == {("", "pods/eviction", "create", None)}


# Policies that between them enable every operand state and its RBAC.
POLICIES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": {
        "dcgm": {"enabled": True},
        "nodeStatusExporter": {"enabled": True},
        "gds": {"enabled": True},
        "gdrcopy": {"enabled": True},
        "dcgmExporter": {"enablePodLabels": True},
    },
    "kubevirt": {
        "sandboxWorkloads": {"enabled": True},
        "vgpuManager": {"enabled": True, "repository": "r.example", "version": "1"},
    },
    "kata": {"sandboxWorkloads": {"enabled": True, "mode": "kata"}},
}


def operand_rbac(policy: dict[str, Any], tmp_path: Path, openshift: bool) -> list[dict[str, Any]]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    argv = [
        sys.executable,
        "-m",
        "gpu_operator.cli",
        "render",
        "--policy",
        str(path),
        "--shape",
        "dgx-h100:1",
        "--namespace",
        NAMESPACE,
        "-o",
        "json",
    ] + (["--openshift"] if openshift else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"gpu-operator render failed ({' '.join(argv[3:])}):\n{done.stderr}"
    parsed = json.loads(done.stdout)
    items: list[dict[str, Any]] = parsed["items"] if isinstance(parsed, dict) else parsed
    return [o for o in items if o["kind"] in ("Role", "ClusterRole")]


@pytest.mark.parametrize("openshift", [False, True], ids=["kubernetes", "openshift"])
def test_operator_holds_every_permission_it_hands_to_operands(
    openshift: bool, render: Callable[..., Rendered], tmp_path: Path
) -> None:
    # Kubernetes refuses a Role or binding that grants more than its creator holds.
    values: dict[str, Any] = {"platform": {"openshift": openshift}}
    cluster, namespaced = operator_rules(render(values))
    missing: list[str] = []
    for name, spec in POLICIES.items():
        policy = find(render({**values, **spec}), "ClusterPolicy", "cluster-policy")
        for role in operand_rbac(policy, tmp_path, openshift):
            held = cluster if role["kind"] == "ClusterRole" else cluster | namespaced
            missing += [
                f"{name}: {role['kind']} {role['metadata']['name']} needs {p}"
                for p in sorted(expand(role["rules"]), key=str)
                if not covers(held, p)
            ]
    # (the chart renders its GPUCluster only where the apiserver serves DeviceClass: built here)
    cluster_cr = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"},
        "spec": {
            "draDriver": {"featureGates": {"MPSSupport": True}},
            "dcgm": {"enabled": True},
            "dcgmExporter": {},
        },
    }
    for role in gpucluster_rbac(cluster_cr, tmp_path, openshift):
        held = cluster if role["kind"] == "ClusterRole" else cluster | namespaced
        missing += [
            f"GPUCluster: {role['kind']} {role['metadata']['name']} needs {p}"
            for p in sorted(expand(role["rules"]), key=str)
            if not covers(held, p)
        ]
    assert missing == [], "\n".join(missing)


def gpucluster_rbac(cluster: dict[str, Any], tmp_path: Path, openshift: bool) -> list[dict[str, Any]]:
    path = tmp_path / "gpucluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    argv = [
        sys.executable,
        "-m",
        "gpu_operator.cli",
        "render",
        "--gpucluster",
        str(path),
        "--namespace",
        NAMESPACE,
        "-o",
        "json",
    ] + (["--openshift"] if openshift else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"gpu-operator render failed ({' '.join(argv[3:])}):\n{done.stderr}"
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    roles = [o for o in items if o["kind"] in ("Role", "ClusterRole")]
    assert {r["metadata"]["name"] for r in roles} >= {
        "nvidia-dra-driver-kubeletplugin",
        "compute-domain-daemon",
    }
    return roles
