"""vfio-manage reconcile against the real apiserver, as the vfio-manager's ServiceAccount with only the
permissions it needs (get/patch its Node, create Events): the Node's result label, annotation and Event
(host side: the seed-001 fixture with the kernel simulator, and the command line on an isolated host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import Event, Node
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding, Role, RoleBinding
from lightkube.types import PatchType

from gpu_operator.node.cluster.kubeapi import KubeNodeView
from gpu_operator.node.vfio.incluster import reconcile
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.vocabulary import (
    PASSTHROUGH_DEVICES_ANNOTATION,
    PROBE_FACTS_ANNOTATION,
    VFIO_BOUND_REASON,
    VFIO_REFUSED_REASON,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
)
from tests.support.audit import serviceaccount_user
from tests.support.chaos import writes_by
from tests.support.events import node_events
from tests.support.hostsim import fakehost
from tests.support.waiting import wait_for

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
H100 = [
    "0000:0a:00.0",
    "0000:18:00.0",
    "0000:3b:00.0",
    "0000:44:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b8:00.0",
    "0000:c1:00.0",
]


def vfio_manager_identity(control_plane: ControlPlane, kube: Client, namespace: str) -> Path:
    """A ServiceAccount with exactly the agent's rights; its token kubeconfig."""
    sa = "vfio-manager-test"
    kubeconfig = control_plane.serviceaccount_kubeconfig(namespace, sa)
    subject = [Subject(kind="ServiceAccount", name=sa, namespace=namespace)]
    cluster_role = f"{namespace}-vfio-manager"
    ref = {"apiGroup": "rbac.authorization.k8s.io", "name": cluster_role}
    kube.apply(
        ClusterRole(
            metadata=ObjectMeta(name=cluster_role),
            rules=[PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["get", "patch"])],
        )
    )
    kube.apply(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=cluster_role),
            subjects=subject,
            roleRef=RoleRef(kind="ClusterRole", **ref),
        )
    )
    # Events about a Node live in `default`, whatever namespace the agent runs in.
    kube.apply(
        Role(
            metadata=ObjectMeta(name=cluster_role, namespace="default"),
            rules=[PolicyRule(apiGroups=[""], resources=["events"], verbs=["create"])],
        )
    )
    kube.apply(
        RoleBinding(
            metadata=ObjectMeta(name=cluster_role, namespace="default"),
            subjects=subject,
            roleRef=RoleRef(kind="Role", **ref),
        )
    )
    # The authorizer learns new bindings from its own watch: wait until it grants all three.
    client = Client(KubeConfig.from_file(kubeconfig))
    wanted = (("nodes", "get", None), ("nodes", "patch", None), ("events", "create", "default"))
    wait_for(
        "the ServiceAccount's rights (nodes get/patch, events create in default)",
        lambda: [w for w in wanted if not allowed(client, *w)],
        until=lambda missing: not missing,
        timeout=60,
    )
    return kubeconfig


def allowed(client: Client, resource: str, verb: str, namespace: str | None) -> bool:
    review = SelfSubjectAccessReview(
        spec=SelfSubjectAccessReviewSpec(
            resourceAttributes=ResourceAttributes(resource=resource, verb=verb, namespace=namespace)
        )
    )
    answer = client.create(review)
    return bool(answer.status and answer.status.allowed)


def can_get(client: Client, node: str) -> bool:
    try:
        client.get(Node, node)
    except ApiError as err:
        if err.status.code != 403:
            raise
        return False
    return True


def vfio_events(kube: Client, node: str) -> list[Event]:
    """The vfio manager's events about the Node (the node controller adds its own, RegisteredNode, whenever)."""
    return [e for e in node_events(kube, node) if e.reason in (VFIO_BOUND_REASON, VFIO_REFUSED_REASON)]


def test_mixed_node_binds_four_and_records_the_result_as_the_service_account(
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> None:
    node = fake_nodes("vfio-passthrough:1")[0]
    kube.patch(
        Node,
        node,
        {"metadata": {"annotations": {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:4])}}},
        patch_type=PatchType.MERGE,
    )
    host = fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", tmp_path / "root")
    kubeconfig = vfio_manager_identity(control_plane, kube, namespace)
    client = Client(KubeConfig.from_file(kubeconfig), field_manager="gpu-operator-node")
    wait_for("the ServiceAccount's RBAC to let it read its Node", lambda: can_get(client, node), timeout=60)
    view = KubeNodeView(node, namespace, client=client, component="gpu-operator-vfio-manager")
    kernel = host.kernel()
    record, written = reconcile(host.fs, kernel, view)
    assert written and record["state"] == "bound"
    stored = kube.get(Node, node).metadata
    assert stored is not None and (stored.labels or {})[VFIO_STATE] == "bound"
    gpus = json.loads((stored.annotations or {})[VFIO_RESULT_ANNOTATION])["gpus"]
    assert {a: g["driver"] for a, g in gpus.items()} == {
        **dict.fromkeys(H100[:4], "vfio-pci"),
        **dict.fromkeys(H100[4:], "nvidia"),
    }
    (event,) = vfio_events(kube, node)
    assert event.reason == "VFIOBound" and event.type == "Normal"
    assert event.source is not None and event.source.component == "gpu-operator-vfio-manager"
    assert "4 left for containers" in (event.message or "")
    # A second pass finds everything in place: no sysfs write, no Node patch, no new Event. The
    # Node's writes are counted from the audit log by the agent's user (its resourceVersion also
    # moves with writes by others, such as the simulator's node heartbeats).
    user = serviceaccount_user(namespace, "vfio-manager-test")

    def agent_writes() -> list[tuple[str, str, str]]:
        return [
            (
                e.get("verb", ""),
                (e.get("objectRef") or {}).get("resource", ""),
                (e.get("objectRef") or {}).get("name", ""),
            )
            for e in writes_by(control_plane, user)
        ]

    writes, api_writes = len(kernel.log), agent_writes()
    assert ("patch", "nodes", node) in api_writes, api_writes  # the first pass's patch is seen
    _, written = reconcile(host.fs, kernel, view)
    assert not written and len(kernel.log) == writes
    assert agent_writes() == api_writes
    assert len(vfio_events(kube, node)) == 1


def test_the_command_reports_a_refusal_on_the_node(
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> None:
    node = fake_nodes("vfio-passthrough:1")[0]
    root = tmp_path / "root"
    fakehost.build({**fakehost.load_spec(HOSTS / "h100-nvidia-bound.yaml"), "iommu": False}, root)
    kubeconfig = vfio_manager_identity(control_plane, kube, namespace)
    sa_client = Client(KubeConfig.from_file(kubeconfig))
    wait_for(
        "the ServiceAccount's RBAC to let it read its Node", lambda: can_get(sa_client, node), timeout=60
    )
    env = {**os.environ, "NODE_NAME": node, "OPERATOR_NAMESPACE": namespace, "KUBECONFIG": str(kubeconfig)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "vfio-manage",
            "reconcile",
            "--once",
            f"--host-root={root}",
            "--no-load-module",
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "vfio state refused" in done.stdout
    meta = kube.get(Node, node).metadata
    assert meta is not None and (meta.labels or {})[VFIO_STATE] == "refused"
    (event,) = vfio_events(kube, node)
    assert (
        event.type == "Warning" and event.reason == "VFIORefused" and "IOMMU is off" in (event.message or "")
    )


def test_doctor_reads_the_mixed_list_and_the_advertised_count_from_the_node(
    control_plane: ControlPlane, kube: Client, fake_nodes: Callable[..., list[str]], tmp_path: Path
) -> None:
    node = fake_nodes("vfio-passthrough:1")[0]
    kube.patch(
        Node,
        node,
        {"metadata": {"annotations": {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:4])}}},
        patch_type=PatchType.MERGE,
    )
    host = fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", tmp_path / "root")
    from gpu_operator.node.vfio import manage as vfio

    assert all(p.ok for p in vfio.execute(host.fs, host.kernel(), "bind", H100[:4], False))
    env = {**os.environ, "NODE_NAME": node, "KUBECONFIG": str(control_plane.admin_kubeconfig)}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", "doctor", f"--host-root={host.fs.root}", "--json"],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    findings = {f["code"]: f for f in json.loads(done.stdout)["findings"]}
    # The Node's annotation made it a mixed node: four for VMs, the host driver is right for the other four.
    assert "mixed" in findings["workload"]["summary"] and "host-driver-on-passthrough" not in findings
    # No KubeVirt in this cluster: doctor says so instead of guessing.
    assert "kubevirt.io/v1 KubeVirt" in findings["kubevirt-count-unchecked"]["evidence"][0], (
        done.stdout + done.stderr
    )


def test_probe_publishes_the_gpu_facts_and_judges_the_mixed_node_by_its_annotation(
    control_plane: ControlPlane, kube: Client, fake_nodes: Callable[..., list[str]], tmp_path: Path
) -> None:
    node = fake_nodes("vfio-passthrough:1")[0]
    kube.patch(
        Node,
        node,
        {"metadata": {"annotations": {PASSTHROUGH_DEVICES_ANNOTATION: ",".join(H100[:4])}}},
        patch_type=PatchType.MERGE,
    )
    host = fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", tmp_path / "root")
    from gpu_operator.node.vfio import manage as vfio

    assert all(p.ok for p in vfio.execute(host.fs, host.kernel(), "bind", H100[:4], False))
    env = {
        **os.environ,
        "NODE_NAME": node,
        "OPERATOR_NAMESPACE": "gpu-operator",
        "KUBECONFIG": str(control_plane.admin_kubeconfig),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "node",
            "probe",
            f"--host-root={host.fs.root}",
            "--publish",
            "--once",
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    meta = kube.get(Node, node).metadata
    assert meta is not None
    facts = json.loads((meta.annotations or {})[PROBE_FACTS_ANNOTATION])
    assert {g["vendorDevice"] for g in facts["gpus"]} == {"10de:2330"}
    assert {g["product"] for g in facts["gpus"]} == {"H100 SXM5 80GB"}
    assert [g["driver"] for g in facts["gpus"]] == ["vfio-pci"] * 4 + ["nvidia"] * 4
    reasons = {e.reason for e in node_events(kube, node)}
    assert "HostDriverOnPassthrough" not in reasons and "VfioNotPersistent" in reasons, reasons
