"""The chart's RBAC on the real control plane (kube-apiserver's RBAC authorizer): the operator's
ServiceAccount may do what the chart lists and nothing else, can create its operands' roles without
escalate/bind, and runs the default policy without a single forbidden response."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Namespace

from gpu_operator.kube.client import GPUClusterResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from tests.support.chart import CHART, find, objects, render_chart
from tests.support.chartrbac import (
    Installed,
    OperatorRun,
    RecordingProxy,
    Response,
    apply_all,
    lease_renewals,
    refusals,
    running,
    start_operator,
    stop_operators,
)
from tests.support.permissions import Permission, expand
from tests.support.status import condition, driver_status, policy_status
from tests.support.waiting import wait_for

NAMESPACE = "gpu-operator-rbac"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# Resources the ClusterRole grants that live in namespaces (checked in namespace "default").
NAMESPACED = {"pods", "pods/eviction", "events", "daemonsets", "nodefeatures", "endpoints"}

ClusterPolicy = create_global_resource("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies")


def chart_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return objects(render_chart(values, namespace=NAMESPACE))


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, kube: Client) -> Iterator[Installed]:
    """The chart's CRDs (from crds/) and the operator's RBAC objects, applied as Helm would (admin)."""
    apply_all(kube, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    crds = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
    objs = [
        o
        for o in chart_objects()
        if o["kind"] in RBAC_KINDS and "helm.sh/hook" not in o["metadata"].get("annotations", {})
    ]
    apply_all(kube, crds + objs)
    kubeconfig = control_plane.serviceaccount_kubeconfig(NAMESPACE, "gpu-operator", create=False)
    client = Client(KubeConfig.from_file(kubeconfig), field_manager="gpu-operator")
    try:
        yield Installed(objs, kubeconfig, client)
    finally:
        client.close()
        for obj in objs:
            if obj["kind"].startswith("Cluster"):
                kube.delete(type(from_dict(obj)), obj["metadata"]["name"])
        kube.delete(Namespace, NAMESPACE)


def test_the_serviceaccount_may_do_what_the_chart_lists(installed: Installed) -> None:
    denied: list[str] = []
    for permission in expand(find(installed.objects, "ClusterRole")["rules"]):
        namespace = "default" if permission[1] in NAMESPACED else None
        if not installed.can(permission, namespace):
            denied.append(f"cluster-wide {permission}")
    for permission in expand(find(installed.objects, "Role")["rules"]):
        if not installed.can(permission, NAMESPACE):
            denied.append(f"in {NAMESPACE} {permission}")
    assert denied == []


@pytest.mark.parametrize(
    ("permission", "namespace"),
    [
        (("", "secrets", "get", None), "default"),
        (("", "nodes", "delete", None), None),
        (("rbac.authorization.k8s.io", "clusterroles", "escalate", None), None),
        (("rbac.authorization.k8s.io", "clusterroles", "bind", None), None),
        (("", "pods", "create", None), "default"),
        (("apps", "daemonsets", "create", None), "default"),
        (("coordination.k8s.io", "leases", "update", "someone-elses-lease"), NAMESPACE),
        (("", "namespaces", "patch", "default"), None),
        (("apiextensions.k8s.io", "customresourcedefinitions", "create", None), None),
        # cluster-wide objects it did not render: by name only (rbac.yaml; ClusterRoles by admission,
        # test_rbac_admission.py)
        (
            (
                "admissionregistration.k8s.io",
                "validatingadmissionpolicies",
                "delete",
                "gpu-operator-node-agents",
            ),
            None,
        ),
        (
            ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "patch", "someone-elses"),
            None,
        ),
        (("node.k8s.io", "runtimeclasses", "patch", "gvisor"), None),
        (("resource.k8s.io", "deviceclasses", "delete", "someone-elses.example.com"), None),
        # a pod's image is code execution as its ServiceAccount: no pods patch outside its namespace
        (("", "pods", "patch", None), "default"),
        (("", "secrets", "get", "some-secret"), NAMESPACE),
        (("nfd.k8s-sigs.io", "nodefeatures", "create", None), "default"),
    ],
    ids=lambda v: "-".join(str(x) for x in v if x) if isinstance(v, tuple) else str(v),
)
def test_the_serviceaccount_may_not_do_more(
    permission: Permission, namespace: str | None, installed: Installed
) -> None:
    assert not installed.can(permission, namespace)


def test_operand_roles_are_created_without_escalate(installed: Installed, kube: Client) -> None:
    """What the operator holds it can hand on (RBAC's no-escalation rule); more it cannot."""
    held: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "rbac-test-operand"},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
        ],
    }
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "rbac-test-operand"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "rbac-test-operand",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "some-operand", "namespace": NAMESPACE}],
    }
    more = copy.deepcopy(held)
    more["metadata"]["name"] = "rbac-test-greedy"
    more["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    try:
        installed.client.apply(from_dict(held), force=True)
        installed.client.apply(from_dict(binding), force=True)
        with pytest.raises(ApiError) as refused:
            installed.client.apply(from_dict(more), force=True)
        assert refused.value.status.code == 403
        assert "not currently held" in str(refused.value.status.message)
    finally:
        for obj in (binding, held, more):
            try:
                kube.delete(type(from_dict(obj)), obj["metadata"]["name"])
            except ApiError as err:
                if err.status.code != 404:
                    raise


def test_removing_a_needed_rule_is_caught(installed: Installed, kube: Client) -> None:
    role = find(installed.objects, "ClusterRole")
    eviction = ("", "pods/eviction", "create", None)
    assert installed.can(eviction, "default")
    trimmed = copy.deepcopy(role)
    trimmed["rules"] = [r for r in trimmed["rules"] if r["resources"] != ["pods/eviction"]]
    try:
        kube.apply(from_dict(trimmed), force=True)
        # the authorizer's informer catches up
        wait_for(
            "the authorizer to refuse pods/eviction",
            lambda: installed.can(eviction, "default"),
            until=lambda allowed: not allowed,
            timeout=10,
            interval=0.2,
        )
    finally:
        kube.apply(from_dict(role), force=True)


# -- the operator itself, as the chart's ServiceAccount -------------------------------------------


@pytest.fixture
def operator_run(
    control_plane: ControlPlane, installed: Installed, kube: Client, tmp_path: Path
) -> Iterator[OperatorRun]:
    """Starts `gpu-operator run` as the chart's ServiceAccount, through a RecordingProxy."""
    token = yaml.safe_load(installed.kubeconfig.read_text())["users"][0]["user"]["token"]
    started: list[subprocess.Popen[bytes]] = []
    with RecordingProxy(control_plane.server, control_plane.pki.ca_cert) as proxy:
        kubeconfig = proxy.kubeconfig(tmp_path / "operator.kubeconfig", token)

        def start() -> subprocess.Popen[bytes]:
            started.append(start_operator(kubeconfig, NAMESPACE, tmp_path / f"operator-{len(started)}.log"))
            return started[-1]

        try:
            yield OperatorRun(proxy, start)
        finally:
            stop_operators(started)
            try:
                kube.delete(ClusterPolicy, "cluster-policy")
            except ApiError as err:
                if err.status.code != 404:
                    raise


def test_operator_runs_the_default_policy_without_forbidden_responses(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    operator_run: OperatorRun,
) -> None:
    fake_nodes("dgx-h100:2")
    policy = find(chart_objects(), "ClusterPolicy", "cluster-policy")
    policy["spec"]["psa"] = {"enabled": True}  # the namespace patch goes through the chart's RBAC too
    apply_all(kube, [policy])
    process = operator_run.start()
    proxy = operator_run.proxy

    def state() -> object:
        running(process, proxy)
        return policy_status(kube).get("state")

    def renewals() -> int:
        running(process, proxy)
        return lease_renewals(proxy)

    wait_for(
        "ClusterPolicy ready",
        state,
        until=lambda s: s == "ready",
        timeout=180,
        interval=1,
        context=lambda: refusals(proxy),
    )
    # a few more reconciles and watches, until two more lease renewals went through the proxy
    renewed = lease_renewals(proxy)
    wait_for(
        "two more lease renewals",
        renewals,
        until=lambda n: n >= renewed + 2,
        timeout=60,
        context=lambda: refusals(proxy),
    )
    responses = operator_run.proxy.responses
    assert len(responses) > 20 and {r.method for r in responses} >= {"GET", "PATCH"}
    assert operator_run.proxy.forbidden() == [], refusals(operator_run.proxy)
    labels = kube.get(Namespace, NAMESPACE).metadata.labels or {}
    assert {k: v for k, v in labels.items() if k.startswith("pod-security.kubernetes.io/")} == {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "privileged",
        "pod-security.kubernetes.io/warn": "privileged",
    }, labels


def test_operator_runs_a_gpucluster_without_forbidden_responses(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    operator_run: OperatorRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DRA stack as the chart's ServiceAccount: every object the GPUCluster renders (DeviceClasses,
    the admission policy, the DRA driver's roles, claim templates) is applied without a refusal,
    the finalizer and the namespace label are written, and the teardown removes the finalizer."""
    from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
    from tests.integration.test_gpucluster import IMAGE, NAME, exists, gpucluster_status

    for key, value in CHART_DEFAULT_IMAGES.items():  # the image env the chart's Deployment sets
        monkeypatch.setenv(key, value)
    fake_nodes("dgx-h100:1")
    spec = {
        "draDriver": {**IMAGE, "featureGates": {"MPSSupport": True}},
        "dcgm": {"enabled": True},
        "dcgmExporter": {},
    }
    apply_all(
        kube,
        [
            {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "GPUCluster",
                "metadata": {"name": NAME},
                "spec": spec,
            }
        ],
    )
    process = operator_run.start()
    proxy = operator_run.proxy
    try:

        def state() -> object:
            running(process, proxy)
            return condition(gpucluster_status(kube), "Error").get("reason")

        # the validator's claims need ResourceSlices (the simulator's plugin stand-in, not here):
        # operands applied and waiting for pods is what this test needs
        wait_for(
            "GPUCluster applied, waiting for operand pods",
            state,
            until=lambda r: r == "OperandNotReady",
            timeout=120,
            interval=1,
            context=lambda: refusals(proxy),
        )
        assert exists(kube, GPUClusterResource, NAME)
        assert (
            kube.get(Namespace, NAMESPACE).metadata.labels.get("resource.kubernetes.io/admin-access")
            == "true"
        )
        assert proxy.forbidden() == [], refusals(proxy)
    finally:
        kube.delete(GPUClusterResource, NAME)
    wait_for(
        "the GPUCluster gone (finalizer removed as the chart's ServiceAccount)",
        lambda: not exists(kube, GPUClusterResource, NAME),
        timeout=90,
        context=lambda: refusals(proxy),
    )
    assert proxy.forbidden() == [], refusals(proxy)


def test_operator_without_a_needed_rule_is_refused(
    kube: Client,
    installed: Installed,
    fake_nodes: Callable[..., list[str]],
    operator_run: OperatorRun,
) -> None:
    role = find(installed.objects, "ClusterRole")
    trimmed = copy.deepcopy(role)
    for rule in trimmed["rules"]:
        if rule["resources"] == ["nodes"] and "patch" in rule["verbs"]:
            rule["verbs"].remove("patch")  # node labelling needs it
    fake_nodes("dgx-h100:1")
    apply_all(kube, [find(chart_objects(), "ClusterPolicy", "cluster-policy")])
    try:
        kube.apply(from_dict(trimmed), force=True)
        process = operator_run.start()
        proxy = operator_run.proxy

        def refused_node_patches() -> list[Response]:
            running(process, proxy)
            return [r for r in proxy.forbidden() if r.method == "PATCH" and "/nodes/" in r.path]

        wait_for(
            "a refused PATCH of a node",
            refused_node_patches,
            timeout=90,
            interval=1,
            context=lambda: refusals(proxy),
        )
    finally:
        kube.apply(from_dict(role), force=True)


def test_crd_hook_applies_the_crds_with_its_own_narrow_identity(
    control_plane: ControlPlane, kube: Client, installed: Installed, tmp_path: Path
) -> None:
    hook = [
        o
        for o in chart_objects()
        if o["metadata"].get("annotations", {}).get("helm.sh/hook")
        and o["kind"] in RBAC_KINDS
        and o["metadata"]["name"] == "gpu-operator-crds"
    ]
    assert sorted(o["kind"] for o in hook) == ["ClusterRole", "ClusterRoleBinding", "ServiceAccount"]
    job = next(
        o for o in chart_objects() if o["kind"] == "Job" and o["metadata"]["name"] == "gpu-operator-crds"
    )
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "gpu-operator"
    apply_all(kube, hook)
    try:
        sa_kubeconfig = control_plane.serviceaccount_kubeconfig(NAMESPACE, "gpu-operator-crds", create=False)
        token = yaml.safe_load(sa_kubeconfig.read_text())["users"][0]["user"]["token"]
        with RecordingProxy(control_plane.server, control_plane.pki.ca_cert) as proxy:
            env = {**os.environ, "KUBECONFIG": str(proxy.kubeconfig(tmp_path / "hook.kubeconfig", token))}
            done = subprocess.run(
                [sys.executable, "-m", "gpu_operator.cli", *command[1:]],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
        assert done.returncode == 0, done.stdout + done.stderr
        assert proxy.forbidden() == [], refusals(proxy)
        assert {r.method for r in proxy.responses} >= {"PATCH"}
    finally:
        for obj in hook:
            if obj["kind"].startswith("Cluster"):
                kube.delete(type(from_dict(obj)), obj["metadata"]["name"])


def nvidiadriver_reason(kube: Client, name: str) -> str | None:
    status = driver_status(kube, name)
    failing = condition(status, "Error") if condition(status, "Error").get("status") == "True" else {}
    ready = condition(status, "Ready") if condition(status, "Ready").get("status") == "True" else {}
    return str((failing or ready).get("reason")) if status else None


def test_operator_runs_nvidiadrivers_without_forbidden_responses(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    operator_run: OperatorRun,
) -> None:
    """The chart's default NVIDIADriver, then two overlapping ones (status writes, Node events)."""
    from gpu_operator.kube.client import NVIDIADriverResource

    (node,) = fake_nodes("dgx-h100:1")
    chart = chart_objects({"driver": {"nvidiaDriverCRD": {"enabled": True}}})
    overlapping = [
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "metadata": {"name": name},
            "spec": {"version": "580.82.07", "nodeSelector": {"nvidia.com/gpu.present": "true"}},
        }
        for name in ("rbac-x", "rbac-y")
    ]
    apply_all(kube, [find(chart, "ClusterPolicy", "cluster-policy"), find(chart, "NVIDIADriver", "default")])
    process = operator_run.start()
    try:
        for names, reason in ((["default"], "Reconciled"), (["rbac-x", "rbac-y"], "ConflictingNodeSelector")):
            if names != ["default"]:
                apply_all(kube, overlapping)

            def reasons(names: list[str] = names) -> dict[str, str | None]:
                running(process, operator_run.proxy)
                return {n: nvidiadriver_reason(kube, n) for n in names}

            def all_have(got: dict[str, str | None], reason: str = reason) -> bool:
                return set(got.values()) == {reason}

            def statuses(names: list[str] = names) -> str:
                return f"{ {n: driver_status(kube, n) for n in names} }\n{refusals(operator_run.proxy)}"

            wait_for(f"{names} {reason}", reasons, until=all_have, timeout=180, interval=1, context=statuses)
        assert any(r.method == "POST" and r.path.endswith("/events") for r in operator_run.proxy.responses)
        assert operator_run.proxy.forbidden() == [], refusals(operator_run.proxy)
    finally:
        for name in ("default", "rbac-x", "rbac-y"):
            try:
                kube.delete(NVIDIADriverResource, name)
            except ApiError as err:
                if err.status.code != 404:
                    raise
