"""NVIDIA's device plugin deployed on the real node without the operator, as its own chart does
(NVIDIA/k8s-device-plugin deployments/helm: a DaemonSet of the plugin image with the kubelet's
device-plugins directory as a hostPath): one pod of the plugin's image (`pluginimage`, the
stand-in under NVIDIA's name) bound to the node. For what needs a plugin but not the operator
(the runtime's and the kubelet's side of GPUs, `sim fault` on the real node); with the operator,
its own DaemonSet runs the plugin there (and this pod must not: both would serve one socket).

The stand-in acts only while this pod runs: `start` creates it, `stop` deletes it and waits until
it is gone, and the kubelet sees the plugin's socket go with it. `configure` plays NVIDIA's
config-manager: a new config file (a hostPath here, the pod's CONFIG_FILE) and SIGHUP to the
plugin's process in the pod.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.error
from pathlib import Path
from typing import Any

from gpu_operator.sim.hardware import migtree
from gpu_operator.sim.realnode.pluginimage import DEVICE_PLUGIN_IMAGE
from gpu_operator.sim.realnode.realnode import (
    DEVICE_PLUGIN_DIR,
    RealNode,
    RealNodeError,
    cgroup_dirs,
    cgroup_pids,
)

NAMESPACE = "kube-system"
POD = "nvidia-device-plugin"
CONFIG = "/config/config.yaml"
HOSTS = "/sim-hosts"
STAND_IN = b"gpu_operator.sim.standins.deviceplugin"


def config_dir(node: RealNode) -> Path:
    """The plugin's config directory on the node (the pod's /config): config.yaml, its CONFIG_FILE."""
    return node.base_dir / "device-plugin-config"


def pod_manifest(node: str, host_root: Path, mig_strategy: str = "") -> dict[str, Any]:
    """The plugin's pod on `node` over `host_root` (its GPUs), DEVICE_LIST_STRATEGY envvar. The
    tree is mounted at HOSTS/<its name> with its MIG state beside it, where there is one
    (`migtree.tree_state`: the MIG manager's work, which NVML would report)."""
    mig_state = host_root.parent / migtree.STATE_FILE
    env = [{"name": "CONFIG_FILE", "value": CONFIG}, {"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}]
    if mig_strategy:
        env.append({"name": "MIG_STRATEGY", "value": mig_strategy})

    def host(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "hostPath": {"path": path, "type": "Directory"}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "nvidia-device-plugin"},
        },
        "spec": {
            "nodeName": node,
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "nvidia-device-plugin-ctr",
                    "image": DEVICE_PLUGIN_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["nvidia-device-plugin"],
                    "args": [f"--host-root={HOSTS}/{host_root.name}"],
                    "env": env,
                    "securityContext": {"privileged": True},
                    "volumeMounts": [
                        {"name": "device-plugin", "mountPath": DEVICE_PLUGIN_DIR},
                        {"name": "host-root", "mountPath": f"{HOSTS}/{host_root.name}", "readOnly": True},
                        *(
                            [
                                {
                                    "name": "mig-state",
                                    "mountPath": f"{HOSTS}/{migtree.STATE_FILE}",
                                    "readOnly": True,
                                }
                            ]
                            if mig_state.is_file()
                            else []
                        ),
                        {"name": "config", "mountPath": "/config", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                host("device-plugin", DEVICE_PLUGIN_DIR),
                host("host-root", str(host_root)),
                *(
                    [{"name": "mig-state", "hostPath": {"path": str(mig_state), "type": "File"}}]
                    if mig_state.is_file()
                    else []
                ),
                host("config", ""),
            ],
        },
    }


def start(node: RealNode, host_root: Path, mig_strategy: str = "", timeout: float = 120.0) -> None:
    """The plugin's pod over `host_root` with the default config (config-manager's empty link),
    until it runs with the stand-in's process in it; callers wait for the allocatable they expect
    (`RealNode.wait_allocatable`: the Node may still show what an earlier plugin registered)."""
    configs = config_dir(node)
    configs.mkdir(parents=True, exist_ok=True)
    (configs / "config.yaml").write_text("")
    manifest = pod_manifest(node.name, Path(host_root).absolute(), mig_strategy)
    manifest["spec"]["volumes"][-1]["hostPath"]["path"] = str(configs)
    node.admin("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", manifest)
    deadline = time.monotonic() + timeout
    while True:
        status = node.admin("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}").get("status", {})
        if status.get("phase") == "Running" and plugin_pids(node):
            return
        if time.monotonic() > deadline:
            raise RealNodeError(
                f"real node {node.name}: the device plugin pod {NAMESPACE}/{POD} is not running "
                f"its plugin after {timeout:.0f}s; its status: {status}"
            )
        time.sleep(0.5)


def stop(node: RealNode, timeout: float = 60.0) -> None:
    """Delete the plugin's pod and wait until it is gone, and its process (its socket with it)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
    with contextlib.suppress(urllib.error.HTTPError):
        node.admin("DELETE", path)
    deadline = time.monotonic() + timeout
    while True:
        try:
            node.admin("GET", path)
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
            if not plugin_pids(node):
                return
        if time.monotonic() > deadline:
            raise RealNodeError(
                f"real node {node.name}: the device plugin pod {NAMESPACE}/{POD} "
                f"is still there {timeout:.0f}s after its deletion"
            )
        time.sleep(0.5)


def plugin_pids(node: RealNode) -> list[int]:
    """The host PIDs of the device-plugin stand-in's processes in the node's containers."""
    found = []
    for pid in sorted(
        set().union(*(cgroup_pids(leaf) for leaf in cgroup_dirs(node.cgroup_name) if leaf.exists()))
    ):
        with contextlib.suppress(OSError):
            if STAND_IN in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def configure(node: RealNode, text: str) -> None:
    """A new plugin config and SIGHUP to the plugin, as NVIDIA's config-manager does when the
    node's `nvidia.com/device-plugin.config` label chooses another one."""
    (config_dir(node) / "config.yaml").write_text(text)
    pids = plugin_pids(node)
    if not pids:
        raise RealNodeError(f"real node {node.name}: no device plugin runs in a pod there to reconfigure")
    for pid in pids:
        os.kill(pid, signal.SIGHUP)
