"""The install a user does, for real: `helm install` of our chart (real Helm) with the operator
Deployment, the CRD hook Job and the pre-delete cleanup Job scheduled on the real node, running
our image (from the node's containerd) as the chart deploys it; kwok nodes are the GPU fleet.

The operator's namespace enforces the `restricted` Pod Security level when the chart is
installed, so the operator pod is admitted only if it is restricted itself; with psa.enabled the
operator then labels its namespace privileged for its operands."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node, Pod

from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.helm import offline_chart, real_node_values
from gpu_operator.sim.realnode import RealNode
from tests.integration.realnode_fixtures import REAL_NODE, api_log
from tests.integration.test_clean_uninstall import differences, marks
from tests.support.audit import forbidden_in_namespace, serviceaccount_user, status_code
from tests.support.chart import objects, render_chart
from tests.support.cleanup import delete_if_present
from tests.support.status import policy_status
from tests.support.waiting import wait_for

NAMESPACE = "gpu-operator-helm"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}


def _values() -> dict[str, Any]:
    """What `gpu-operator sim up --real-node --helm` installs with (sim/helm.py): NFD off, psa
    on, the operator and its hook Jobs on the real node, our operands there reading its host tree."""
    return real_node_values(REAL_NODE, "/run/gpu-operator-sim-no-host")


@pytest.fixture
def restricted_namespace(kube: Client) -> Iterator[str]:
    kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE, labels=RESTRICTED)))
    yield NAMESPACE
    delete_if_present(kube, Namespace, NAMESPACE)


def _operator_pods(kube: Client) -> list[dict[str, Any]]:
    return [p.to_dict() for p in kube.list(Pod, namespace=NAMESPACE, labels={"app": "gpu-operator"})]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _hook_accounts() -> dict[str, str]:
    """The ServiceAccount of each hook Job, as the chart renders it: {job name: account}."""
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"]["serviceAccountName"]
            for o in objects(render_chart(_values(), namespace=NAMESPACE)) if o["kind"] == "Job"}


def _writes_by(plane: ControlPlane, account: str, resource: str) -> list[str]:
    """2xx writes of one of our ServiceAccounts to `resource`, from the audit log's fields."""
    user = serviceaccount_user(NAMESPACE, account)
    return [f"{e.get('verb')} {e['objectRef'].get('name')}" for e in plane.audit_events()
            if e.get("stage") == "ResponseComplete" and e.get("user", {}).get("username") == user
            and (e.get("objectRef") or {}).get("resource") == resource
            and 200 <= (status_code(e) or 0) < 300]


def _labelled(kube: Client, node: str) -> bool:
    labels = kube.get(Node, node).metadata.labels or {}
    return labels.get("nvidia.com/gpu.deploy.device-plugin") == "true"


def test_helm_install_runs_our_operator_as_a_restricted_pod_on_the_real_node(
        control_plane: ControlPlane, kube: Client, real_node: RealNode, restricted_namespace: str,
        fake_nodes: Callable[..., list[str]], tmp_path: Path) -> None:
    gpu_nodes = fake_nodes("dgx-h100:2")
    before = marks(kube)
    helm = helm_python.Config(kubeconfig_path=control_plane.admin_kubeconfig, namespace=NAMESPACE)
    t0 = time.monotonic()
    with helm_python.Chart.load(offline_chart(tmp_path / "gpu-operator")) as chart:
        # The pre-install hook Job (`gpu-operator crds apply`) runs on the real node: Helm waits for it.
        helm.install(chart, "gpu-operator", _values(), namespace=NAMESPACE, timeout=300)
    installed = time.monotonic() - t0
    hooks = _hook_accounts()
    # Helm waited for the hook Job, which only the real node could run (its nodeSelector): its
    # ServiceAccount applied our CRDs.
    assert _writes_by(control_plane, hooks["gpu-operator-crds"], "customresourcedefinitions")

    def operator_pod() -> dict[str, Any] | None:
        pods = _operator_pods(kube)
        return pods[0] if len(pods) == 1 and _ready(pods[0]) else None
    pod = wait_for("the operator pod Ready on the real node (kubelet probes /readyz)", operator_pod,
                   timeout=180, context=lambda: str(_operator_pods(kube))[-3000:])
    assert pod is not None
    name, spec = pod["metadata"]["name"], pod["spec"]

    def log() -> str:
        return "\n".join(api_log(control_plane, NAMESPACE, name, "gpu-operator")[-80:])
    assert spec["nodeName"] == REAL_NODE
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    # admitted under `restricted` (the namespace enforced it when the pod was created)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    # In-cluster config and the ServiceAccount token: the pod holds the Lease under its own name.
    lease = wait_for("the Lease held by the operator pod", lambda: kube.get(Lease, LEASE_NAME, namespace=NAMESPACE),
                     until=lambda ls: ls.spec is not None and (ls.spec.holderIdentity or "").startswith(name + "_"),
                     timeout=60)
    assert lease.spec is not None
    # psa.enabled: the operator labels its namespace for its privileged operands
    wait_for("the namespace labelled privileged by the operator",
             lambda: (kube.get(Namespace, NAMESPACE).metadata.labels or {}).get("pod-security.kubernetes.io/enforce"),
             until=lambda v: v == "privileged", timeout=60, context=log)
    status = wait_for("the chart's ClusterPolicy ready", lambda: policy_status(kube, "cluster-policy"),
                      until=lambda s: s.get("state") == "ready", timeout=300, context=log)
    assert status["state"] == "ready"
    for node in gpu_nodes:
        wait_for(f"{node} labelled by the operator pod", lambda n=node: _labelled(kube, n),  # type: ignore[misc]
                 timeout=60)
    assert forbidden_in_namespace(control_plane, NAMESPACE) == []
    messages = api_log(control_plane, NAMESPACE, name, "gpu-operator")
    assert any("became the leader" in m for m in messages), messages[-20:]
    assert not any("Traceback" in m for m in messages), "\n".join(messages[-60:])
    print(f"helm install with the CRD hook Job on the real node: {installed:.1f} s; operator pod {name} Ready")

    # Uninstall: the pre-delete Job runs `gpu-operator cleanup` on the real node, for real.
    t1 = time.monotonic()
    helm.uninstall("gpu-operator", timeout=300)
    uninstalled = time.monotonic() - t1
    cleaned = _writes_by(control_plane, hooks["gpu-operator-cleanup"], "clusterpolicies")
    assert cleaned == ["delete cluster-policy"], cleaned
    wait_for("every node as it was before the install", lambda: differences(before, marks(kube)),
             until=lambda d: d == [], timeout=120)
    wait_for("the operator Deployment gone", lambda: [d for d in kube.list(Deployment, namespace=NAMESPACE)],
             until=lambda d: d == [], timeout=60)
    assert forbidden_in_namespace(control_plane, NAMESPACE) == []
    wait_for("the Lease deleted by the stopping operator", lambda: [
        ls for ls in kube.list(Lease, namespace=NAMESPACE) if ls.metadata and ls.metadata.name == LEASE_NAME],
        until=lambda found: found == [], timeout=60)
    print(f"helm uninstall (pre-delete Job on the real node): {uninstalled:.1f} s")
