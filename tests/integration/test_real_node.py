"""The simulator's real node: a kubelet + containerd registered with the test apiserver, running
our image for real; its pods reach the apiserver with their own ServiceAccount."""

from __future__ import annotations

import time
import urllib.error
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode.realnode import RealNode
from gpu_operator.sim.realnode.realspec import HOST_DRIVER_VERSION, host_spec
from gpu_operator.vocabulary import (
    DRIVER_SOURCE,
    DRIVER_VERSION,
    PROBE_STATUS,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
)
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, api_log
from tests.integration.test_vfio_manager_api import vfio_manager_identity
from tests.support import audit
from tests.support.audit import serviceaccount_user
from tests.support.events import node_events
from tests.support.waiting import wait_for

# Lists pods in its namespace with the in-cluster credentials the kubelet mounted: prints the
# HTTP status, so a missing permission shows as 403 in the log.
LIST_PODS = """
import os, ssl, urllib.request, urllib.error
sa = '/var/run/secrets/kubernetes.io/serviceaccount/'
ns = open(sa + 'namespace').read()
req = urllib.request.Request(
    f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
    f"/api/v1/namespaces/{ns}/pods", headers={'Authorization': 'Bearer ' + open(sa + 'token').read()})
try:
    print('status', urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sa + 'ca.crt')).status)
except urllib.error.HTTPError as err:
    print('status', err.code)
"""


def _get_or_none(plane: ControlPlane, path: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = plane.request("GET", path)
        return found
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def _run_pod(
    plane: ControlPlane,
    namespace: str,
    name: str,
    sa: str,
    timeout: float = 120,
    command: list[str] | None = None,
    host_root: Path | None = None,
) -> dict[str, Any]:
    """A pod of our image on the real node, run to its end; `host_root` is mounted at /host."""
    main: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "command": command or ["python3.11", "-c", LIST_PODS],
    }
    spec: dict[str, Any] = {
        "nodeName": REAL_NODE,
        "restartPolicy": "Never",
        "serviceAccountName": sa,
        "containers": [main],
    }
    if host_root is not None:
        main["env"] = [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "OPERATOR_NAMESPACE", "value": namespace},
            {"name": "GPU_OPERATOR_NO_CHROOT", "value": "1"},
        ]  # a host tree has no shell
        main["volumeMounts"] = [{"name": "host-root", "mountPath": "/host"}]
        spec["volumes"] = [{"name": "host-root", "hostPath": {"path": str(host_root), "type": "Directory"}}]
    plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
    )
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            return pod
        assert time.monotonic() < deadline, f"pod {namespace}/{name} still {pod['status']}"
        time.sleep(0.5)


def test_real_node_registers_with_its_own_identity(control_plane: ControlPlane, real_node: RealNode) -> None:
    node = control_plane.request("GET", f"/api/v1/nodes/{REAL_NODE}")
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    # It renews its Lease as system:node:<name> (the Node authorizer lets it touch only its own).
    # The kubelet reports Ready before its first Lease renewal lands: wait for the Lease.
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{REAL_NODE}"
    lease = wait_for(f"the Lease of {REAL_NODE}", lambda: _get_or_none(control_plane, lease_path), timeout=60)
    assert lease is not None and lease["spec"]["holderIdentity"] == REAL_NODE


def test_pods_of_our_image_run_and_reach_the_apiserver_as_their_serviceaccount(
    control_plane: ControlPlane, real_node: RealNode, namespace: str
) -> None:
    plane = control_plane
    for path, body in (
        (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}}),
        (
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
            {
                "metadata": {"name": "reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            },
        ),
        (
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
            {
                "metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        ),
    ):
        plane.request("POST", path, body)
    allowed = _run_pod(plane, namespace, "allowed", "reader")
    denied = _run_pod(plane, namespace, "denied", "default")
    for pod in (allowed, denied):
        state = pod["status"]["containerStatuses"][0]["state"]
        assert state.get("terminated", {}).get("exitCode") == 0, state
        assert pod["status"]["podIP"].startswith("10.88."), pod["status"]  # the node's CNI bridge
    assert "status 200" in api_log(plane, namespace, "allowed", "main")
    # The same program without the binding: the 403 a real operand would hit shows in its log,
    # and the apiserver's audit log records the refusal for that ServiceAccount only.
    assert "status 403" in api_log(plane, namespace, "denied", "main")
    assert [line.split()[0] for line in audit.refused(plane, serviceaccount_user(namespace))] == [
        serviceaccount_user(namespace, "default")
    ]


def _passthrough_host(root: Path, shared_group: bool) -> Path:
    """A vm-passthrough host tree whose GPUs still sit on nvidia; with `shared_group`, a NIC shares
    the first GPU's IOMMU group (vfio-manage must refuse to move that GPU)."""
    spec = host_spec("vfio-passthrough")
    spec.update(pci_drivers=["nvidia", "i40e"], modules=["nvidia", "vfio_pci", "vfio", "vfio_iommu_type1"])
    for device in spec["devices"]:
        device["driver"] = "nvidia"
    spec["devices"][0]["iommu_group"] = 10
    if shared_group:
        spec["devices"].append(
            {
                "address": "0000:40:00.0",
                "vendor": "8086",
                "device": "1572",
                "class": "020000",
                "driver": "i40e",
                "iommu_group": 10,
            }
        )
    hosttree.build(spec, root)
    return root


def test_vfio_manage_runs_in_pods_on_the_real_node(
    control_plane: ControlPlane, kube: Client, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    """Our image's vfio-manage in pods on the real node (the vfio-manager DaemonSet itself runs an
    NVIDIA image, which cannot run here): a dry run prints the plan; a shared IOMMU group is
    refused, in the pod's log and as a Warning Event on the Node, written with the pod's own token."""
    plane = control_plane
    dry = _run_pod(
        plane,
        namespace,
        "vfio-dry-run",
        "default",
        host_root=_passthrough_host(tmp_path / "a", False),
        command=["gpu-operator", "vfio-manage", "bind", "--all", "--dry-run", "--no-load-module"],
    )
    log = "\n".join(api_log(plane, namespace, "vfio-dry-run", "main"))
    assert dry["status"]["phase"] == "Succeeded", (dry["status"], log)
    assert "driver_override" in log and "vfio-pci" in log and "REFUSED" not in log, log

    vfio_manager_identity(plane, kube, namespace)
    reconcile = ["gpu-operator", "vfio-manage", "reconcile", "--once", "--no-load-module"]
    try:
        refused = _run_pod(
            plane,
            namespace,
            "vfio-refused",
            "vfio-manager-test",
            command=reconcile,
            host_root=_passthrough_host(tmp_path / "b", True),
        )
        log = "\n".join(api_log(plane, namespace, "vfio-refused", "main"))
        assert refused["status"]["phase"] == "Failed", (refused["status"], log)
        assert "vfio state refused" in log and "also holds non-NVIDIA devices: 0000:40:00.0" in log, log
        events = [e for e in node_events(kube, REAL_NODE) if e.reason == "VFIORefused"]
        assert events and events[-1].type == "Warning" and "0000:40:00.0" in (events[-1].message or ""), (
            events
        )
        assert audit.refused(plane, serviceaccount_user(namespace, "vfio-manager-test")) == []
    finally:
        kube.patch(
            Node,
            REAL_NODE,
            {"metadata": {"labels": {VFIO_STATE: None}, "annotations": {VFIO_RESULT_ANNOTATION: None}}},
            patch_type=PatchType.MERGE,
        )


def test_the_probe_publishes_the_host_trees_facts_from_a_pod_on_the_real_node(
    control_plane: ControlPlane, kube: Client, real_node: RealNode, namespace: str
) -> None:
    """`gpu-operator node probe --publish` (the probe DaemonSet's command) in a pod of our image on the
    real node, as a ServiceAccount that may only get/patch Nodes and create Events."""
    assert real_node.host_root is not None
    vfio_manager_identity(control_plane, kube, namespace)  # the same rights the probe needs
    try:
        done = _run_pod(
            control_plane,
            namespace,
            "probe",
            "vfio-manager-test",
            host_root=real_node.host_root,
            command=["gpu-operator", "node", "probe", "--publish", "--once"],
        )
        log = "\n".join(api_log(control_plane, namespace, "probe", "main"))
        assert done["status"]["phase"] == "Succeeded", log[-3000:]
        meta = kube.get(Node, REAL_NODE).metadata
        labels = meta.labels or {} if meta else {}
        assert labels[DRIVER_SOURCE] == "host" and labels[DRIVER_VERSION] == HOST_DRIVER_VERSION, labels
        assert labels[PROBE_STATUS] == "ok", (labels, log)
        assert audit.refused(control_plane, serviceaccount_user(namespace, "vfio-manager-test")) == [], log
    finally:
        kube.patch(
            Node,
            REAL_NODE,
            {"metadata": {"labels": dict.fromkeys((DRIVER_SOURCE, DRIVER_VERSION, PROBE_STATUS))}},
            patch_type=PatchType.MERGE,
        )
