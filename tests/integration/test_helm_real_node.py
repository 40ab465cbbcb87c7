"""The install a user does, for real: `helm install`, `helm upgrade` and `helm uninstall` of our
chart (real Helm) with the operator Deployment, the CRD hook Job and the pre-delete cleanup Job
scheduled on the real node, running our image (from the node's containerd) as the chart deploys
it; kwok nodes are the GPU fleet. One release walks through the steps in order, one per test.

The operator's namespace enforces the `restricted` Pod Security level when the chart is
installed, so the operator pod is admitted only if it is restricted itself; with psa.enabled the
operator then labels its namespace privileged for its operands. Every step fails on a 403 in the
audit log for the namespace's ServiceAccounts, on an operator pod that restarted, and on a
Traceback in the operator's log."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python
import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node, Pod

from gpu_operator import __version__
from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane import nodes
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import merge, packaged_chart, real_node_values, release_names
from gpu_operator.sim.realnode.realnode import RealNode
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, api_log
from tests.integration.test_clean_uninstall import differences, marks
from tests.support.audit import forbidden_in_namespace, serviceaccount_user, status_code
from tests.support.chart import objects, render_chart
from tests.support.cleanup import delete_if_present
from tests.support.status import policy_status
from tests.support.waiting import wait_for

NAMESPACE = "gpu-operator-helm"
RELEASE = "gpu-operator"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
RETAGGED = f"{__version__}-rebuilt"
READ_VERBS = {"get", "list", "watch"}


def _values() -> dict[str, Any]:
    """What `gpu-operator sim up --real-node --helm` installs with (sim/plane/helm.py): NFD off, psa
    on, the operator and its hook Jobs on the real node, our operands there reading its host tree."""
    return real_node_values(REAL_NODE, "/run/gpu-operator-sim-no-host")


@dataclass
class Release:
    plane: ControlPlane
    kube: Client
    node: RealNode
    chart: Path
    gpu_nodes: list[str]
    before: dict[str, Any]
    helm: helm_python.Config
    figures: dict[str, float] = field(default_factory=dict)

    def install(self, values: dict[str, Any]) -> float:
        t0 = time.monotonic()
        with helm_python.Chart.load(self.chart) as chart:
            self.helm.install(chart, RELEASE, values, namespace=NAMESPACE, timeout=300)
        return time.monotonic() - t0

    def upgrade(self, values: dict[str, Any]) -> float:
        t0 = time.monotonic()
        with helm_python.Chart.load(self.chart) as chart:
            self.helm.upgrade(chart, RELEASE, values, namespace=NAMESPACE, timeout=300)
        return time.monotonic() - t0

    def operator_pods(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self.kube.list(Pod, namespace=NAMESPACE, labels={"app": "gpu-operator"})]

    def leading_pod(self, not_named: str = "") -> dict[str, Any]:
        """The one Ready operator pod (another than `not_named`) once it holds the Lease."""

        def found() -> dict[str, Any] | None:
            pods = [
                p
                for p in self.operator_pods()
                if _ready(p)
                and p["metadata"]["name"] != not_named
                and not p["metadata"].get("deletionTimestamp")
            ]
            if len(pods) != 1 or not self.holder().startswith(pods[0]["metadata"]["name"] + "_"):
                return None
            return pods[0]

        pod = wait_for(
            "the operator pod Ready on the real node and holding the Lease",
            found,
            timeout=180,
            context=lambda: f"holder {self.holder()!r}; pods {str(self.operator_pods())[-2500:]}",
        )
        assert pod is not None
        return pod

    def holder(self) -> str:
        leases = [
            ls
            for ls in self.kube.list(Lease, namespace=NAMESPACE)
            if ls.metadata and ls.metadata.name == LEASE_NAME
        ]
        return (leases[0].spec.holderIdentity or "") if leases and leases[0].spec else ""

    def log(self, pod: str) -> list[str]:
        return api_log(self.plane, NAMESPACE, pod, "gpu-operator")

    def assert_clean(self, pod: dict[str, Any]) -> None:
        """No 403 for our ServiceAccounts, the pod never restarted, no Traceback in its log."""
        assert forbidden_in_namespace(self.plane, NAMESPACE) == []
        name = pod["metadata"]["name"]
        current = next(p for p in self.operator_pods() if p["metadata"]["name"] == name)
        assert current["status"]["containerStatuses"][0]["restartCount"] == 0, current["status"]
        messages = self.log(name)
        assert not any("Traceback" in m for m in messages), "\n".join(messages[-60:])

    def writes_by_pod(self, pod: str, after: dt.datetime) -> list[str]:
        """Writes the apiserver received from `pod` (its bound token names the pod) after `after`."""
        found = []
        for e in self.plane.audit_events():
            extra = (e.get("user") or {}).get("extra") or {}
            if e.get("stage") != "ResponseComplete" or pod not in extra.get(
                "authentication.kubernetes.io/pod-name", []
            ):
                continue
            if e.get("verb") in READ_VERBS or _time(e["requestReceivedTimestamp"]) <= after:
                continue
            ref = e.get("objectRef") or {}
            found.append(f"{e.get('verb')} {ref.get('resource')} {ref.get('name')} -> {status_code(e)}")
        return found

    def wait_policy_ready(self, pod: str) -> None:
        wait_for(
            "the chart's ClusterPolicy ready",
            lambda: policy_status(self.kube, "cluster-policy"),
            until=lambda s: s.get("state") == "ready",
            timeout=300,
            context=lambda: "\n".join(self.log(pod)[-60:]),
        )


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _lease_acquired(kube: Client) -> dt.datetime:
    lease = kube.get(Lease, LEASE_NAME, namespace=NAMESPACE)
    assert lease.spec is not None and lease.spec.acquireTime is not None
    return lease.spec.acquireTime


def _hook_accounts() -> dict[str, str]:
    """The ServiceAccount of each hook Job, as the chart renders it: {job name: account}."""
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["serviceAccountName"]
        for o in objects(render_chart(_values(), namespace=NAMESPACE))
        if o["kind"] == "Job"
    }


def _writes_by(plane: ControlPlane, account: str, resource: str) -> list[str]:
    """2xx writes of one of our ServiceAccounts to `resource`, from the audit log's fields."""
    user = serviceaccount_user(NAMESPACE, account)
    return [
        f"{e.get('verb')} {e['objectRef'].get('name')}"
        for e in plane.audit_events()
        if e.get("stage") == "ResponseComplete"
        and e.get("user", {}).get("username") == user
        and (e.get("objectRef") or {}).get("resource") == resource
        and 200 <= (status_code(e) or 0) < 300
    ]


def _labelled(kube: Client, node: str) -> bool:
    labels = kube.get(Node, node).metadata.labels or {}
    return labels.get("nvidia.com/gpu.deploy.device-plugin") == "true"


@pytest.fixture(scope="module")
def release(
    control_plane: ControlPlane, kube: Client, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE, labels=RESTRICTED)))
    gpu_nodes = nodes.add_nodes(kube, ["dgx-h100:2"], start=9100)
    nodes.wait_ready(kube, gpu_nodes)
    # Our image under a second tag, as a rebuilt image would arrive (same content, another name).
    real_node.containerd.ctr("images", "tag", "--force", IMAGE, IMAGE.rsplit(":", 1)[0] + ":" + RETAGGED)
    chart = packaged_chart(tmp_path_factory.mktemp("chart"))  # installed as a user would: the package
    helm = helm_python.Config(kubeconfig_path=control_plane.admin_kubeconfig, namespace=NAMESPACE)
    state = Release(control_plane, kube, real_node, chart, gpu_nodes, marks(kube), helm)
    try:
        yield state
    finally:
        if RELEASE in release_names(helm):
            helm.uninstall(RELEASE, timeout=300)
        # Later tests of the session create their own ClusterPolicy of the same name.
        wait_for(
            "the chart's ClusterPolicy gone",
            lambda: [p.metadata.name for p in kube.list(ClusterPolicyResource) if p.metadata],
            until=lambda names: "cluster-policy" not in names,
            timeout=120,
        )
        delete_if_present(kube, Namespace, NAMESPACE)
        nodes.remove_nodes(kube, gpu_nodes)
        print(
            "\nhelm lifecycle on the real node: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in state.figures.items())
        )


def test_install_runs_our_operator_as_a_restricted_pod_on_the_real_node(release: Release) -> None:
    kube, plane = release.kube, release.plane
    # The pre-install hook Job (`gpu-operator crds apply`) runs on the real node: Helm waits for it.
    release.figures["install"] = release.install(_values())
    t0 = time.monotonic()
    assert _writes_by(plane, _hook_accounts()["gpu-operator-crds"], "customresourcedefinitions")
    pod = (
        release.leading_pod()
    )  # in-cluster config and the ServiceAccount token: the Lease under its pod name
    spec = pod["spec"]
    assert spec["nodeName"] == REAL_NODE
    # admitted under `restricted` (the namespace enforced it when the pod was created)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # psa.enabled: the operator labels its namespace for its privileged operands
    wait_for(
        "the namespace labelled privileged by the operator",
        lambda: (kube.get(Namespace, NAMESPACE).metadata.labels or {}).get(
            "pod-security.kubernetes.io/enforce"
        ),
        until=lambda v: v == "privileged",
        timeout=60,
    )
    release.wait_policy_ready(pod["metadata"]["name"])
    release.figures["install -> ClusterPolicy ready"] = release.figures["install"] + time.monotonic() - t0
    for node in release.gpu_nodes:
        wait_for(
            f"{node} labelled by the operator pod",
            lambda n=node: _labelled(kube, n),  # type: ignore[misc]
            timeout=60,
        )
    assert any("became the leader" in m for m in release.log(pod["metadata"]["name"]))
    release.assert_clean(pod)


def test_another_pod_scrapes_the_operators_metrics(release: Release) -> None:
    """/metrics on the pod network (the chart's port 8080), from another pod on the real node."""
    ip = release.leading_pod()["status"]["podIP"]
    scrape = (
        f"import urllib.request; body = urllib.request.urlopen('http://{ip}:8080/metrics', timeout=10)"
        ".read().decode(); print([line for line in body.splitlines() if line.startswith('gpu_operator_leader ')])"
    )
    release.plane.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "scraper"},
            "spec": {
                "nodeName": REAL_NODE,
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": IMAGE, "command": ["python3.11", "-c", scrape]}],
            },
        },
    )
    try:
        phase = wait_for(
            "the scraper pod finished",
            lambda: release.plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/scraper")[
                "status"
            ].get("phase"),
            until=lambda p: p in ("Succeeded", "Failed"),
            timeout=120,
        )
        lines = api_log(release.plane, NAMESPACE, "scraper", "main")
        assert phase == "Succeeded", lines
        assert lines == ["['gpu_operator_leader 1.0']"], lines
    finally:
        delete_if_present(release.kube, Pod, "scraper", NAMESPACE)


def test_must_gather_holds_the_real_node_pods_logs(release: Release, tmp_path: Path) -> None:
    """The support bundle fetches logs through the API: from the real node's kubelet they arrive."""
    pod = release.leading_pod()["metadata"]["name"]
    out = tmp_path / "bundle.tar.gz"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "must-gather",
            "--out",
            str(out),
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            str(release.plane.admin_kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with tarfile.open(out) as tar:
        names = tar.getnames()
        log = next(n for n in names if n.endswith(f"logs/{pod}/gpu-operator.log"))
        member = tar.extractfile(log)
        assert member is not None and "became the leader" in member.read().decode()
        errors = next((n for n in names if n.endswith("errors.txt")), None)
        report = tar.extractfile(errors) if errors else None
        failed = report.read().decode() if report else ""
    assert f"logs of {pod}/" not in failed, failed


def test_upgrade_with_new_values_is_applied_by_the_new_operator_pod(release: Release) -> None:
    kube = release.kube
    old = release.leading_pod()["metadata"]["name"]
    assert kube.get(DaemonSet, "nvidia-dcgm-exporter", namespace=NAMESPACE)
    values = merge(
        _values(), {"operator": {"logging": {"level": "debug"}}, "dcgmExporter": {"enabled": False}}
    )
    t0 = time.monotonic()
    release.upgrade(values)
    # The pod template changed (--log-level debug): the Deployment rolls; the new pod, Ready as a
    # standby, replaces the old one, which releases the Lease on SIGTERM.
    pod = release.leading_pod(not_named=old)
    release.figures["upgrade -> new pod leading"] = time.monotonic() - t0
    acquired = _lease_acquired(kube)
    assert "--log-level" in pod["spec"]["containers"][0]["args"]
    assert pod["spec"]["containers"][0]["args"][-1] == "debug"
    # The new operator applied the toggled operand: the DCGM exporter DaemonSet is gone.
    wait_for(
        "the DCGM exporter DaemonSet removed by the new operator",
        lambda: [
            d
            for d in kube.list(DaemonSet, namespace=NAMESPACE)
            if d.metadata and d.metadata.name == "nvidia-dcgm-exporter"
        ],
        until=lambda left: left == [],
        timeout=120,
        context=lambda: "\n".join(release.log(pod["metadata"]["name"])[-40:]),
    )
    assert any("log level debug" in m for m in release.log(pod["metadata"]["name"]))
    assert release.writes_by_pod(old, after=acquired) == []
    release.assert_clean(pod)


def test_upgrade_to_another_image_tag_rolls_the_operator(release: Release) -> None:
    kube = release.kube
    old = release.leading_pod()["metadata"]["name"]
    values = merge(_values(), {"operator": {"version": RETAGGED}})
    t0 = time.monotonic()
    release.upgrade(values)
    pod = release.leading_pod(not_named=old)
    release.figures["image upgrade -> new pod leading"] = time.monotonic() - t0
    acquired = _lease_acquired(kube)
    assert pod["spec"]["containers"][0]["image"].endswith(":" + RETAGGED)
    wait_for(
        "the old operator pod gone",
        lambda: [p for p in release.operator_pods() if p["metadata"]["name"] == old],
        until=lambda left: left == [],
        timeout=120,
    )
    # After the new pod took the Lease, the old one wrote nothing (its release came before).
    assert release.writes_by_pod(old, after=acquired) == []
    release.wait_policy_ready(pod["metadata"]["name"])
    release.assert_clean(pod)


def test_uninstall_runs_the_cleanup_job_and_leaves_the_nodes_as_they_were(release: Release) -> None:
    kube, plane = release.kube, release.plane
    t0 = time.monotonic()
    release.helm.uninstall(RELEASE, timeout=300)
    release.figures["uninstall"] = time.monotonic() - t0
    cleanup = _hook_accounts()["gpu-operator-cleanup"]
    assert _writes_by(plane, cleanup, "clusterpolicies") == ["delete cluster-policy"]
    # it stopped the operator before Helm deleted the operator's RBAC
    assert _writes_by(plane, cleanup, "deployments") == ["patch gpu-operator"]
    wait_for(
        "every node as it was before the install",
        lambda: differences(release.before, marks(kube)),
        until=lambda d: d == [],
        timeout=120,
    )
    release.figures["uninstall -> nodes clean"] = time.monotonic() - t0
    wait_for(
        "the operator Deployment gone",
        lambda: list(kube.list(Deployment, namespace=NAMESPACE)),
        until=lambda d: d == [],
        timeout=60,
    )
    assert release.holder() == "" and not [
        ls for ls in kube.list(Lease, namespace=NAMESPACE) if ls.metadata and ls.metadata.name == LEASE_NAME
    ]
    assert forbidden_in_namespace(plane, NAMESPACE) == []


def test_a_second_install_into_the_same_cluster_works(release: Release) -> None:
    release.figures["second install"] = release.install(_values())
    pod = release.leading_pod()
    release.wait_policy_ready(pod["metadata"]["name"])
    release.assert_clean(pod)
