"""The container toolkit's stand-in on a kwok node of the k3s shape, end to end on the control
plane: a pod of the k3s toolkit DaemonSet (as the renderer makes it) runs on the node, and the
nvidia runtime lands in k3s' containerd template in the node's host tree, where k3s reads it; a pod
of the stock DaemonSet there leaves k3s' template alone."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from gpu_operator.render.states.container_toolkit import STATE
from gpu_operator.sim import standins
from gpu_operator.sim.controlplane import ControlPlane
from tests.support.waiting import wait_for
from tests.unit.render.renderkit import run

TEMPLATE = "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
CRI = "io.containerd.grpc.v1.cri"


def toolkit_pod(namespace: str, node: str, daemonset: str) -> Pod:
    """A pod bound to the kwok node (kwok marks it Running) with the rendered DaemonSet's template."""
    result = run({}, "k3s:1")
    ds = next(o for o in result.state(STATE).objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == daemonset)
    template = ds["spec"]["template"]
    spec: dict[str, Any] = {**template["spec"], "nodeName": node}
    for key in ("affinity", "nodeSelector", "initContainers", "serviceAccountName", "priorityClassName"):
        spec.pop(key, None)
    return cast(Pod, Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"toolkit-{node}", "namespace": namespace, "labels": template["metadata"]["labels"]}, "spec": spec}))


def runtimes(tree: Path) -> dict[str, Any]:
    file = tree / TEMPLATE
    if not file.is_file():
        return {}
    doc = tomllib.loads(file.read_text())
    return cast(dict[str, Any], doc.get("plugins", {}).get(CRI, {}).get("containerd", {}).get("runtimes", {}))


def test_the_k3s_toolkit_writes_where_k3s_reads(control_plane: ControlPlane, kube: Client,
                                                 fake_nodes: Callable[..., list[str]], namespace: str,
                                                 tmp_path: Path) -> None:
    k3s, stock = fake_nodes("k3s:2")
    hosts = tmp_path / "hosts"
    with standins.running(KubeConfig.from_file(control_plane.admin_kubeconfig), hosts=hosts):
        kube.create(toolkit_pod(namespace, k3s, "nvidia-container-toolkit-daemonset-k3s"))
        kube.create(toolkit_pod(namespace, stock, "nvidia-container-toolkit-daemonset"))
        found: dict[str, Any] = wait_for("the nvidia runtime in k3s' template",
                                         lambda: runtimes(hosts / k3s / "root").get("nvidia") or {})
        assert found["options"]["BinaryName"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"
        wait_for("the stock toolkit's write on the second node",
                 lambda: (hosts / stock / "root" / "etc/containerd/config.toml").is_file())
        assert runtimes(hosts / stock / "root") == {}
