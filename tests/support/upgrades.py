# Moved from an integration test module: read lightkube's models as those do (pyproject.toml's
# tests.integration.* rule: a None the apiserver never sends fails loudly, no guard per attribute).
# mypy: disable-error-code="union-attr"
"""What the driver upgrade tests watch and do (tests/integration/test_upgrades.py): every upgrade
state label change of the nodes (`StateRecorder`, the tests' independent witness), the nodes' states
and driver pods now, the `gpu-operator upgrade` command, a new driver version in the ClusterPolicy and
the operator's pending-upgrades gauge."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpu_operator.controllers.units.upgrade.state import ACTIVE
from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import UPGRADE_STATE


class StateRecorder:
    """Watches Nodes and records every state label change (the test's independent witness)."""

    def __init__(self, kube: Client, names: list[str]) -> None:
        self.kube, self.names = kube, set(names)
        self.states: dict[str, str] = {}
        self.history: dict[str, list[str]] = {n: [] for n in names}
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for _, node in self.kube.watch(Node, server_timeout=5):
                    self._see(node)
                    if self.stop.is_set():
                        return
            except Exception:  # the watch is restarted; the next list catches up
                time.sleep(0.2)

    def _see(self, node: Node) -> None:
        name = str(node.metadata.name)
        if name not in self.names:
            return
        state = (node.metadata.labels or {}).get(UPGRADE_STATE, "")
        if self.states.get(name) != state:
            self.states[name] = state
            self.history[name].append(state)
        self.peak = max(self.peak, sum(1 for s in self.states.values() if s in ACTIVE))

    def __enter__(self) -> StateRecorder:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()


def states(kube: Client, names: list[str]) -> dict[str, str]:
    return {n: (kube.get(Node, n).metadata.labels or {}).get(UPGRADE_STATE, "") for n in names}


def driver_pods(kube: Client, namespace: str) -> dict[str, str]:
    """node -> driver pod name."""
    return {
        str(p.spec.nodeName): str(p.metadata.name)
        for p in kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/component": "nvidia-driver"})
        if p.spec.nodeName
    }


def cli(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", *args, f"--kubeconfig={plane.admin_kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def upgrade_driver(kube: Client, version: str) -> None:
    driver = {"repository": "nvcr.io/nvidia", "image": "driver", "version": version}
    kube.patch(
        ClusterPolicyResource, "cluster-policy", {"spec": {"driver": driver}}, patch_type=PatchType.MERGE
    )


def upgrades_pending(operator: OperatorProcess) -> float:
    """The operator's gpu_operator_nodes_upgrades_pending gauge (the sum over owners)."""
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
    )
    return next(
        (
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("gpu_operator_nodes_upgrades_pending ")
        ),
        -1.0,
    )


def standalone_dra_driver(node: str, namespace: str, account: str, role: str) -> list[dict[str, Any]]:
    """NVIDIA's standalone DRA driver, in the order to create it: its chart's identity (a
    ServiceAccount bound to what the kubelet plugin does: publish the node's ResourceSlices, read
    claims, nodes and pods; the simulator's stand-in acts with that token), its gpu.nvidia.com
    DeviceClass and its kubelet plugin's DaemonSet on `node`."""
    match = {"app": "nvidia-dra-driver-kubelet-plugin"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "delete"],
                },
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dra-driver-gpu-kubelet-plugin", "namespace": namespace},
            "spec": {
                "selector": {"matchLabels": match},
                "template": {
                    "metadata": {"labels": match},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "serviceAccountName": account,
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {"name": "gpus", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0"}
                        ],
                    },
                },
            },
        },
    ]
