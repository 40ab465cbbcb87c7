"""The container toolkit's stand-in on kwok nodes of the k3s and crio shapes, end to end on the
control plane: a pod of the distribution's toolkit DaemonSet (as the renderer makes it) runs on the
node, and the nvidia runtime lands in the node's host tree where that runtime reads it (k3s'
containerd template; CRI-O's drop-in or, without CDI, its hooks dir, read back by the probe's own
runtime reader); a pod of the stock DaemonSet on a k3s node leaves k3s' template alone."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runtime import ContainerRuntime, detect_runtime
from gpu_operator.render.states.container_toolkit import STATE
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.standins import roster
from tests.support.waiting import wait_for
from tests.unit.render.renderkit import run

TEMPLATE = "var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
CRI = "io.containerd.grpc.v1.cri"


def toolkit_pod(
    namespace: str, node: str, daemonset: str, shape: str = "k3s:1", policy: dict[str, Any] | None = None
) -> Pod:
    """A pod bound to the kwok node (kwok marks it Running) with the rendered DaemonSet's template."""
    result = run(policy or {}, shape)
    ds = next(
        o
        for o in result.state(STATE).objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == daemonset
    )
    template = ds["spec"]["template"]
    spec: dict[str, Any] = {**template["spec"], "nodeName": node}
    for key in ("affinity", "nodeSelector", "initContainers", "serviceAccountName", "priorityClassName"):
        spec.pop(key, None)
    return cast(
        Pod,
        Pod.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"toolkit-{node}",
                    "namespace": namespace,
                    "labels": template["metadata"]["labels"],
                },
                "spec": spec,
            }
        ),
    )


def runtimes(tree: Path) -> dict[str, Any]:
    file = tree / TEMPLATE
    if not file.is_file():
        return {}
    doc = tomllib.loads(file.read_text())
    return cast(dict[str, Any], doc.get("plugins", {}).get(CRI, {}).get("containerd", {}).get("runtimes", {}))


def test_the_k3s_toolkit_writes_where_k3s_reads(
    control_plane: ControlPlane,
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    namespace: str,
    tmp_path: Path,
) -> None:
    k3s, stock = fake_nodes("k3s:2")
    hosts = tmp_path / "hosts"
    with roster.running(KubeConfig.from_file(control_plane.admin_kubeconfig), hosts=hosts):
        kube.create(toolkit_pod(namespace, k3s, "nvidia-container-toolkit-daemonset-k3s"))
        kube.create(toolkit_pod(namespace, stock, "nvidia-container-toolkit-daemonset"))
        found: dict[str, Any] = wait_for(
            "the nvidia runtime in k3s' template", lambda: runtimes(hosts / k3s / "root").get("nvidia") or {}
        )
        assert found["options"]["BinaryName"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"
        wait_for(
            "the stock toolkit's write on the second node",
            lambda: (hosts / stock / "root" / "etc/containerd/config.toml").is_file(),
        )
        assert runtimes(hosts / stock / "root") == {}


CRIO_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"


def crio(tree: Path) -> ContainerRuntime:
    """The node's runtime as the probe reads it, once CRI-O's config is there (the tree is built lazily)."""
    return (
        detect_runtime(HostFS(tree)) if (tree / "etc/crio/crio.conf").is_file() else ContainerRuntime(name="")
    )


def test_the_crio_toolkit_writes_where_crio_reads(
    control_plane: ControlPlane,
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    namespace: str,
    tmp_path: Path,
) -> None:
    """CDI on: the drop-in's runtimes; CDI off: the OCI hook, removed again when its pod goes."""
    drop_in, hooked = fake_nodes("crio:2")
    hosts = tmp_path / "hosts"
    with roster.running(KubeConfig.from_file(control_plane.admin_kubeconfig), hosts=hosts):
        kube.create(toolkit_pod(namespace, drop_in, "nvidia-container-toolkit-daemonset", "crio:1"))
        hook_pod = toolkit_pod(
            namespace, hooked, "nvidia-container-toolkit-daemonset", "crio:1", {"cdi": {"enabled": False}}
        )
        kube.create(hook_pod)
        found = wait_for(
            "the nvidia runtime in CRI-O's drop-in",
            lambda: crio(hosts / drop_in / "root"),
            until=lambda rt: rt.nvidia_runtime,
        )
        assert found.config_files[-1] == "/etc/crio/crio.conf.d/99-nvidia.conf" and found.nvidia_hook is None
        hook = wait_for(
            "the nvidia hook in CRI-O's hooks dir", lambda: crio(hosts / hooked / "root").nvidia_hook
        )
        assert hook == CRIO_HOOK and not crio(hosts / hooked / "root").nvidia_runtime
        assert hook_pod.metadata is not None and hook_pod.metadata.name is not None
        kube.delete(Pod, hook_pod.metadata.name, namespace=namespace, grace_period=0)
        wait_for(
            "the hook removed at the toolkit's shutdown",
            lambda: not (hosts / hooked / "root" / CRIO_HOOK.lstrip("/")).exists(),
        )
        assert crio(hosts / drop_in / "root").nvidia_runtime
