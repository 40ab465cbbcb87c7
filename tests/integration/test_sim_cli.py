"""`gpu-operator sim up/status/down/demo` as a user runs them: separate processes, detached components."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node

from gpu_operator.sim.state import SimState


def sim(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_operator.cli", "sim", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def processes_mentioning(path: Path) -> list[int]:
    """Live processes whose command line names `path` (the simulator puts its dir in every argv)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(path) in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def test_up_leaves_it_running_status_reports_down_stops_it(tmp_path: Path) -> None:
    where = tmp_path / "sim"
    up = sim("up", "--dir", str(where), "--shape", "dgx-h100:2", "--shape", "cpu:1")
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"export KUBECONFIG={where / 'admin.kubeconfig'}"
    assert "starting kube-apiserver" in up.stderr  # progress on long waits
    try:
        state = SimState.load(where)
        assert state is not None
        assert [p.name for p in state.alive()] == ["etcd", "kube-apiserver", "kube-controller-manager",
                                                   "kube-scheduler", "kwok"]
        client = Client(KubeConfig.from_file(state.kubeconfig))
        assert sorted(str(n.metadata.name) for n in client.list(Node)) == ["cpu-0", "dgx-h100-0", "dgx-h100-1"]
        client.close()

        status = sim("status", "--dir", str(where))
        assert status.returncode == 0, status.stdout
        assert "nodes: 3" in status.stdout and "kube-apiserver" in status.stdout

        again = sim("up", "--dir", str(where))  # reuses, starts nothing twice
        assert again.returncode == 0 and "reusing the simulator" in again.stderr
    finally:
        down = sim("down", "--dir", str(where))
    assert down.returncode == 0 and "stopped kwok" in down.stderr
    assert not any(p.alive for p in state.processes)
    assert processes_mentioning(where) == []
    assert "nothing running" in sim("down", "--dir", str(where)).stdout
    assert sim("status", "--dir", str(where)).returncode == 1


def test_demo_reaches_ready_and_leaves_nothing_behind(tmp_path: Path) -> None:
    where = tmp_path / "demo"
    demo = sim("demo", "--dir", str(where), "--shape", "dgx-h100:2", "--timeout", "180", timeout=420)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    assert "Demo summary" in out and "ClusterPolicy cluster-policy: ready (Reconciled)" in out
    assert "dgx-h100-0" in out and "dgx-h100-1" in out and "Everything is ready." in out
    assert "export KUBECONFIG=" in out and "Tearing down now." in out
    assert "stopped operator" in out
    assert processes_mentioning(where) == []
    assert not (where / "state.json").exists()


def test_up_with_a_real_node_and_down_removes_every_container(tmp_path: Path) -> None:
    import time

    from lightkube.codecs import from_dict
    from lightkube.resources.core_v1 import Pod

    from gpu_operator.render.defaults import OWN_IMAGE
    from gpu_operator.sim.realnode import cgroup_dirs

    where = tmp_path / "sim"
    up = sim("up", "--dir", str(where), "--shape", "cpu:1", "--real-node")
    assert up.returncode == 0, up.stderr
    state = SimState.load(where)
    assert state is not None and state.real_node["name"] == "real-node-0"
    try:
        assert {"real-node-sandbox", "real-node-containerd", "real-node-kubelet", "real-node-nsproxy"} <= \
            {p.name for p in state.alive()}
        client = Client(KubeConfig.from_file(state.kubeconfig))
        node = client.get(Node, "real-node-0")
        assert node.status is not None and node.status.nodeInfo is not None
        assert node.status.nodeInfo.kubeletVersion == "v1.36.3"
        labels = node.metadata.labels if node.metadata and node.metadata.labels else {}
        assert labels["nvidia.com/gpu.deploy.driver"] == "false"  # NVIDIA images stay off it
        assert "nvidia.com/gpu.deploy.operator-validator" not in labels  # ours may run there
        # a container of our image that would run forever: `down` must remove it
        client.create(from_dict({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": "default"},
            "spec": {"nodeName": "real-node-0", "containers": [
                {"name": "main", "image": OWN_IMAGE, "command": ["sleep", "100000"]}]}}))
        deadline = time.monotonic() + 60
        while (pod := client.get(Pod, "sleeper", namespace="default")).status.phase != "Running":
            assert time.monotonic() < deadline, pod.status
            time.sleep(0.5)
        client.close()
        assert any(d.exists() for d in cgroup_dirs("real-node-0"))
    finally:
        down = sim("down", "--dir", str(where))
    assert down.returncode == 0 and "real node" in down.stderr, down.stderr
    assert not any(p.alive for p in state.processes)
    assert processes_mentioning(where) == []
    # removable only once empty: no container process is left
    assert not [d for d in cgroup_dirs("real-node-0") if d.exists()]
    assert str(where) not in Path("/proc/self/mountinfo").read_text()
