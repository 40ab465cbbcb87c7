"""The chart's RBAC on the real control plane (kube-apiserver's RBAC authorizer): the operator's
ServiceAccount may do what the chart lists and nothing else, can create its operands' roles without
escalate/bind, and runs the default policy without a single forbidden response."""

from __future__ import annotations

import copy
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import Namespace

from gpu_operator.sim.controlplane import ControlPlane, free_port

CHART = Path(__file__).resolve().parents[2] / "deployments" / "gpu-operator"
NAMESPACE = "gpu-operator-rbac"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# Resources the ClusterRole grants that live in namespaces (checked in namespace "default").
NAMESPACED = {"pods", "pods/eviction", "events", "daemonsets", "nodefeatures", "endpoints"}

Permission = tuple[str, str, str, str | None]
ClusterPolicy = create_global_resource("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies")


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    layered = {"nfd": {"enabled": False}, **(values or {})}
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(layered, name="gpu-operator", namespace=NAMESPACE, is_install=True)
    return [doc for name, text in sorted(rendered.items()) if not name.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def pick(objs: list[dict[str, Any]], kind: str, name: str = "gpu-operator") -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def expand(rules: list[dict[str, Any]]) -> list[Permission]:
    return [(group, resource, verb, name) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]
            for name in (rule.get("resourceNames") or [None])]


@dataclass
class Installed:
    objects: list[dict[str, Any]]
    kubeconfig: Path
    client: Client

    def can(self, permission: Permission, namespace: str | None) -> bool:
        group, resource, verb, name = permission
        main, _, sub = resource.partition("/")
        review = SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(resourceAttributes=ResourceAttributes(
            group=group, resource=main, subresource=sub or None, verb=verb, name=name, namespace=namespace)))
        answer = self.client.create(review)
        return bool(answer.status and answer.status.allowed)


def apply_all(kube: Client, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        kube.apply(from_dict(obj), force=True)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, kube: Client) -> Iterator[Installed]:
    """The chart's CRDs (from crds/) and the operator's RBAC objects, applied as Helm would (admin)."""
    apply_all(kube, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    crds = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
    objs = [o for o in render_chart() if o["kind"] in RBAC_KINDS and "helm.sh/hook" not in
            o["metadata"].get("annotations", {})]
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
    for permission in expand(pick(installed.objects, "ClusterRole")["rules"]):
        namespace = "default" if permission[1] in NAMESPACED else None
        if not installed.can(permission, namespace):
            denied.append(f"cluster-wide {permission}")
    for permission in expand(pick(installed.objects, "Role")["rules"]):
        if not installed.can(permission, NAMESPACE):
            denied.append(f"in {NAMESPACE} {permission}")
    assert denied == []


@pytest.mark.parametrize(("permission", "namespace"), [
    (("", "secrets", "get", None), "default"),
    (("", "nodes", "delete", None), None),
    (("rbac.authorization.k8s.io", "clusterroles", "escalate", None), None),
    (("rbac.authorization.k8s.io", "clusterroles", "bind", None), None),
    (("", "pods", "create", None), "default"),
    (("apps", "daemonsets", "create", None), "default"),
    (("coordination.k8s.io", "leases", "update", "someone-elses-lease"), NAMESPACE),
    (("", "namespaces", "patch", "default"), None),
    (("apiextensions.k8s.io", "customresourcedefinitions", "create", None), None),
], ids=lambda v: "-".join(str(x) for x in v if x) if isinstance(v, tuple) else str(v))
def test_the_serviceaccount_may_not_do_more(permission: Permission, namespace: str | None,
                                            installed: Installed) -> None:
    assert not installed.can(permission, namespace)


def test_operand_roles_are_created_without_escalate(control_plane: ControlPlane, installed: Installed,
                                                   kube: Client) -> None:
    """What the operator holds it can hand on (RBAC's no-escalation rule); more it cannot. Also shows
    that the 403 counter used below sees a refusal."""
    held = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "rbac-test-operand"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch", "update"]},
                  {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"],
                   "verbs": ["get", "list", "watch", "create", "update"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "rbac-test-operand"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rbac-test-operand"},
        "subjects": [{"kind": "ServiceAccount", "name": "some-operand", "namespace": NAMESPACE}],
    }
    more = copy.deepcopy(held)
    more["metadata"]["name"] = "rbac-test-greedy"
    more["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    try:
        before = forbidden_counts(control_plane)
        installed.client.apply(from_dict(held), force=True)  # type: ignore[call-overload]
        installed.client.apply(from_dict(binding), force=True)  # type: ignore[call-overload]
        assert new_forbidden(before, forbidden_counts(control_plane)) == {}
        with pytest.raises(ApiError) as refused:
            installed.client.apply(from_dict(more), force=True)  # type: ignore[call-overload]
        assert refused.value.status.code == 403
        assert "not currently held" in str(refused.value.status.message)
        refusals = new_forbidden(before, forbidden_counts(control_plane))
        assert [k for k in refusals if 'resource="clusterroles"' in k], refusals
    finally:
        for obj in (binding, held, more):
            try:
                kube.delete(type(from_dict(obj)), obj["metadata"]["name"])
            except ApiError as err:
                if err.status.code != 404:
                    raise


def test_removing_a_needed_rule_is_caught(installed: Installed, kube: Client) -> None:
    role = pick(installed.objects, "ClusterRole")
    eviction = ("", "pods/eviction", "create", None)
    assert installed.can(eviction, "default")
    trimmed = copy.deepcopy(role)
    trimmed["rules"] = [r for r in trimmed["rules"] if r["resources"] != ["pods/eviction"]]
    try:
        kube.apply(from_dict(trimmed), force=True)  # type: ignore[call-overload]
        deadline = time.monotonic() + 10
        while installed.can(eviction, "default") and time.monotonic() < deadline:
            time.sleep(0.2)  # the authorizer's informer catches up
        assert not installed.can(eviction, "default")
    finally:
        kube.apply(from_dict(role), force=True)  # type: ignore[call-overload]


# -- the operator itself, as the chart's ServiceAccount -------------------------------------------

FORBIDDEN = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*code="403"[^}]*)\} (?P<count>\S+)$', re.M)


def forbidden_counts(control_plane: ControlPlane) -> dict[str, float]:
    """403 responses served so far, by request labels (verb, group, resource...)."""
    context: ssl.SSLContext = control_plane.ssl_context("admin")
    with urllib.request.urlopen(f"{control_plane.server}/metrics", context=context, timeout=30) as resp:
        text = resp.read().decode()
    return {m["labels"]: float(m["count"]) for m in FORBIDDEN.finditer(text)}


def new_forbidden(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}


def operator_available() -> bool:
    done = subprocess.run([sys.executable, "-m", "gpu_operator.cli", "run", "--help"],
                          capture_output=True, text=True, timeout=60)
    return done.returncode == 0


@pytest.fixture
def run_operator(installed: Installed, kube: Client, tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    if not operator_available():
        pytest.skip("`gpu-operator run` is not registered yet: the operator run as the chart's "
                    "ServiceAccount cannot be tested")
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / f"operator-{len(started)}.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(installed.kubeconfig), "OPERATOR_NAMESPACE": NAMESPACE}
        argv = [sys.executable, "-m", "gpu_operator.cli", "run", "--namespace", NAMESPACE, "--leader-elect",
                "--metrics-bind-address", f"127.0.0.1:{free_port()}",
                "--health-probe-bind-address", f"127.0.0.1:{free_port()}"]
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        started.append(process)
        return process

    yield start
    try:
        kube.delete(ClusterPolicy, "cluster-policy")
    except ApiError as err:
        if err.status.code != 404:
            raise
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def policy_state(kube: Client) -> str | None:
    try:
        got = kube.get(ClusterPolicy, "cluster-policy")
    except ApiError:
        return None
    status = getattr(got, "status", None) or {}
    state = status.get("state") if isinstance(status, dict) else None
    return str(state) if state else None


def test_operator_runs_the_default_policy_without_forbidden_responses(
    control_plane: ControlPlane, kube: Client, installed: Installed, fake_nodes: Callable[..., list[str]],
    run_operator: Callable[[], subprocess.Popen[bytes]],
) -> None:
    fake_nodes("dgx-h100:2")
    before = forbidden_counts(control_plane)
    apply_all(kube, [pick(render_chart(), "ClusterPolicy", "cluster-policy")])
    process = run_operator()
    deadline = time.monotonic() + 180
    while policy_state(kube) != "ready":
        assert process.poll() is None, f"the operator exited with {process.returncode}"
        assert time.monotonic() < deadline, f"ClusterPolicy not ready: {policy_state(kube)}"
        time.sleep(1)
    time.sleep(5)  # a few more reconciles, watches and lease renewals
    assert new_forbidden(before, forbidden_counts(control_plane)) == {}


def test_operator_without_a_needed_rule_is_refused(
    control_plane: ControlPlane, kube: Client, installed: Installed, fake_nodes: Callable[..., list[str]],
    run_operator: Callable[[], subprocess.Popen[bytes]],
) -> None:
    role = pick(installed.objects, "ClusterRole")
    trimmed = copy.deepcopy(role)
    # node labelling needs nodes patch
    trimmed["rules"] = [r for r in trimmed["rules"] if not (r["resources"] == ["nodes"] and "patch" in r["verbs"])]
    fake_nodes("dgx-h100:1")
    apply_all(kube, [pick(render_chart(), "ClusterPolicy", "cluster-policy")])
    try:
        kube.apply(from_dict(trimmed), force=True)  # type: ignore[call-overload]
        before = forbidden_counts(control_plane)
        run_operator()
        deadline = time.monotonic() + 90
        while not any('resource="nodes"' in k for k in new_forbidden(before, forbidden_counts(control_plane))):
            assert time.monotonic() < deadline, "the operator never hit the missing nodes/patch rule"
            time.sleep(1)
    finally:
        kube.apply(from_dict(role), force=True)  # type: ignore[call-overload]
