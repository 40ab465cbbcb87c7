"""The simulator's real node: a kubelet + containerd registered with the test apiserver, running
our image for real; its pods reach the apiserver with their own ServiceAccount."""

from __future__ import annotations

import time
import urllib.error
from typing import Any

from gpu_operator.sim.controlplane import ControlPlane
from gpu_operator.sim.realnode import RealNode
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, pod_log
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


def _run_pod(plane: ControlPlane, namespace: str, name: str, sa: str, timeout: float = 120) -> dict[str, Any]:
    plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": REAL_NODE, "restartPolicy": "Never", "serviceAccountName": sa,
                 "containers": [{"name": "main", "image": IMAGE, "command": ["python3.11", "-c", LIST_PODS]}]},
    })
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
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    # It renews its Lease as system:node:<name> (the Node authorizer lets it touch only its own).
    # The kubelet reports Ready before its first Lease renewal lands: wait for the Lease.
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{REAL_NODE}"
    lease = wait_for(f"the Lease of {REAL_NODE}", lambda: _get_or_none(control_plane, lease_path), timeout=60)
    assert lease is not None and lease["spec"]["holderIdentity"] == REAL_NODE


def test_pods_of_our_image_run_and_reach_the_apiserver_as_their_serviceaccount(
        control_plane: ControlPlane, real_node: RealNode, namespace: str) -> None:
    plane = control_plane
    for path, body in (
        (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}}),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
         {"metadata": {"name": "reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}),
        (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
         {"metadata": {"name": "reader"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                     "name": "reader"},
          "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]}),
    ):
        plane.request("POST", path, body)
    allowed = _run_pod(plane, namespace, "allowed", "reader")
    denied = _run_pod(plane, namespace, "denied", "default")
    for pod in (allowed, denied):
        state = pod["status"]["containerStatuses"][0]["state"]
        assert state.get("terminated", {}).get("exitCode") == 0, state
        assert pod["status"]["podIP"].startswith("10.88."), pod["status"]  # the node's CNI bridge
    assert "status 200" in pod_log(real_node, namespace, "allowed", "main")
    # The same program without the binding: the 403 a real operand would hit shows in its log.
    assert "status 403" in pod_log(real_node, namespace, "denied", "main")
