"""Node agents against the real apiserver: the probe publishes labels and Node events, the
validator's plugin check reads the Node's allocatable GPUs (host side: a host-root fixture)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from lightkube import Client
from lightkube.resources.core_v1 import Event, Node, Pod

from gpu_operator.sim.plane.controlplane import ControlPlane
from tests.support.hostsim import fakehost
from tests.support.waiting import wait_for

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def agent(control_plane: ControlPlane, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "NODE_NAME": node,
        "OPERATOR_NAMESPACE": "default",
        "KUBECONFIG": str(control_plane.admin_kubeconfig),
    }
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_probe_publishes_driver_source_label(
    control_plane: ControlPlane, kube: Client, fake_nodes: Callable[..., list[str]], tmp_path: Path
) -> None:
    node = fake_nodes("host-driver:1")[0]
    root = tmp_path / "root"
    fakehost.build_file(HOSTS / "ubuntu-apt-driver.yaml", root)
    done = agent(control_plane, node, "node", "probe", f"--host-root={root}", "--publish", "--once")
    assert done.returncode == 0, done.stderr
    labels = kube.get(Node, node).metadata.labels or {}
    assert labels["nvidia.com/gpu.driver.source"] == "host"


def test_probe_reports_a_host_driver_on_a_passthrough_node_as_a_warning_event(
    control_plane: ControlPlane, kube: Client, fake_nodes: Callable[..., list[str]], tmp_path: Path
) -> None:
    node = fake_nodes("vfio-passthrough:1")[0]  # labelled nvidia.com/gpu.workload.config=vm-passthrough
    root = tmp_path / "root"
    fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", root)
    done = agent(control_plane, node, "node", "probe", f"--host-root={root}", "--publish", "--once")
    assert done.returncode == 0, done.stderr
    events = [
        e
        for e in kube.list(Event, namespace="*")
        if e.involvedObject and e.involvedObject.name == node and e.involvedObject.kind == "Node"
    ]
    assert events, f"no Node event for {node}; agent said: {done.stderr}"
    assert any(e.type == "Warning" and "passthrough" in (e.message or "").lower() for e in events), [
        (e.type, e.reason, e.message) for e in events
    ]
    assert kube.get(Node, node).metadata.labels.get("nvidia.com/gpu.probe.status") == "error"


def test_plugin_validation_sees_allocatable_gpus(
    control_plane: ControlPlane,
    kube: Client,
    namespace: str,
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> None:
    node = fake_nodes("dgx-h100:1")[0]
    # nothing allocatable until the device plugin runs there (the stand-in plays it, sim/standins/kubeletdp.py)
    assert "nvidia.com/gpu" not in (kube.get(Node, node).status.allocatable or {})
    kube.create(
        cast(
            Pod,
            Pod.from_dict(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": "device-plugin",
                        "namespace": namespace,
                        "labels": {"app": "nvidia-device-plugin-daemonset"},
                    },
                    "spec": {
                        "nodeName": node,
                        "containers": [{"name": "plugin", "image": "example.invalid/device-plugin:1"}],
                    },
                }
            ),
        )
    )
    wait_for(
        "allocatable GPUs",
        lambda: (kube.get(Node, node).status.allocatable or {}).get("nvidia.com/gpu"),
        until=lambda n: n == "8",
    )
    root = tmp_path / "root"
    fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", root)
    env_args = ["validate", "--component", "plugin", f"--host-root={root}"]
    os.environ["WITH_WORKLOAD"] = "false"
    try:
        done = agent(control_plane, node, *env_args)
    finally:
        del os.environ["WITH_WORKLOAD"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / "run" / "nvidia" / "validations" / "plugin-ready").exists()
