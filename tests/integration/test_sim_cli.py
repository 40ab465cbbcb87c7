"""`gpu-operator sim up/status/down/demo` as a user runs them: separate processes, detached components."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.sim.commands.state import SimState


def sim(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_operator.cli", "sim", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


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


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory whose path is short: the real node's containerd keeps unix sockets in it, whose
    paths may be 104 bytes at most (a test worker's tmp_path is longer: .../popen-gw0/test_.../)."""
    path = Path(tempfile.mkdtemp(prefix="sim-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_up_leaves_it_running_status_reports_down_stops_it(tmp_path: Path) -> None:
    where = tmp_path / "sim"
    up = sim("up", "--dir", str(where), "--shape", "dgx-h100:2", "--shape", "cpu:1")
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"export KUBECONFIG={where / 'admin.kubeconfig'}"
    assert "starting kube-apiserver" in up.stderr  # progress on long waits
    try:
        state = SimState.load(where)
        assert state is not None
        assert [p.name for p in state.alive()] == [
            "etcd",
            "egress-proxy",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "stand-ins",
        ]
        client = Client(KubeConfig.from_file(state.kubeconfig))
        assert sorted(str(n.metadata.name) for n in client.list(Node)) == [
            "cpu-0",
            "dgx-h100-0",
            "dgx-h100-1",
        ]
        client.close()

        status = sim("status", "--dir", str(where))
        assert status.returncode == 0, status.stdout
        assert "nodes: 3" in status.stdout and "kube-apiserver" in status.stdout

        again = sim("up", "--dir", str(where))  # reuses, starts nothing twice
        assert again.returncode == 0 and "reusing the simulator" in again.stderr
    finally:
        down = sim("down", "--dir", str(where))
    assert down.returncode == 0, down.stderr
    (line,) = [ln for ln in down.stderr.splitlines() if ln.startswith("sim: stopped ")]
    stopped = line.removeprefix("sim: stopped ").split(" (logs kept")[0].split(", ")
    assert {"kwok", "stand-ins", "kube-apiserver", "etcd"} <= set(stopped), stopped
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


def test_demo_of_the_dra_stack_reaches_ready(tmp_path: Path) -> None:
    where = tmp_path / "dra"
    demo = sim(
        "demo", "--dir", str(where), "--shape", "dgx-h100:2", "--gpucluster", "--timeout", "180", timeout=420
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    assert "GPUCluster gpu-cluster: ready (Reconciled)" in out and "Everything is ready." in out
    assert "dra-driver" in out and "dra-validator" in out  # the DRA stack's columns
    assert "get deviceclasses,resourceslices" in out
    assert processes_mentioning(where) == []


def test_demo_with_a_real_node_runs_our_pods_there_and_down_removes_every_container(short_dir: Path) -> None:
    from gpu_operator.sim.realnode.realnode import cgroup_dirs, cgroup_name

    where = short_dir / "sim"
    demo = sim(
        "demo",
        "--dir",
        str(where),
        "--shape",
        "dgx-h100:2",
        "--real-node",
        "--keep",
        "--timeout",
        "240",
        timeout=480,
    )
    state = SimState.load(where)
    try:
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert state is not None and state.real_node["name"] == "real-node-0"
        out = " ".join(demo.stdout.replace("│", " ").split())  # the summary table, unwrapped
        # The real node's row: our operands' cells, from pods that really ran there.
        assert "real-node-0 (host-driver): kubelet + containerd running our image" in out, out
        # the device plugin's pod too (its stand-in's image under NVIDIA's name, sim/realnode/pluginimage.py)
        assert (
            "pods that really ran there: device-plugin, node-status-exporter, operator-validator; "
            "validation passed (4/4)"
        ) in out, out
        assert "status files they wrote: cuda-ready, driver-ready, plugin-ready, toolkit-ready" in out
        assert {
            "real-node-sandbox",
            "real-node-containerd",
            "real-node-kubelet",
            "real-node-nsproxy",
            "operator",
        } <= {p.name for p in state.alive()}
        client = Client(KubeConfig.from_file(state.kubeconfig))
        node = client.get(Node, "real-node-0")
        assert node.status is not None and node.status.nodeInfo is not None
        assert node.status.nodeInfo.kubeletVersion == "v1.37.2"
        labels = node.metadata.labels if node.metadata and node.metadata.labels else {}
        assert labels["nvidia.com/gpu.deploy.driver"] == "false"  # NVIDIA images stay off it
        assert labels["nvidia.com/gpu.deploy.operator-validator"] == "true"  # ours run there
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        # registered by the plugin in the operator's DaemonSet pod, the one plugin the node has
        assert node.status.allocatable is not None and node.status.allocatable["nvidia.com/gpu"] == "2"
        client.close()
        cgroups = cgroup_name("real-node-0", Path(state.real_node["dir"]))
        # the validator's and exporter's containers run forever: `down` must remove them
        assert any(d.exists() for d in cgroup_dirs(cgroups))
    finally:
        down = sim("down", "--dir", str(where))
    assert down.returncode == 0 and "real node" in down.stderr, down.stderr
    assert not any(p.alive for p in state.processes)
    assert processes_mentioning(where) == []
    # removable only once empty: no container process is left
    assert not [d for d in cgroup_dirs(cgroups) if d.exists()]
    assert str(where) not in Path("/proc/self/mountinfo").read_text()


def test_demo_with_helm_installs_the_chart_and_runs_the_operator_pod_on_the_real_node(
    short_dir: Path,
) -> None:
    where = short_dir / "sim"
    demo = sim(
        "demo",
        "--dir",
        str(where),
        "--shape",
        "dgx-h100:1",
        "--real-node",
        "--helm",
        "--keep",
        "--timeout",
        "240",
        timeout=480,
    )
    state = SimState.load(where)
    try:
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert state is not None
        assert "helm install gpu-operator into namespace gpu-operator" in demo.stdout, demo.stdout[-3000:]
        assert (where / "real-node-values.yaml").exists()
        out = " ".join(demo.stdout.replace("│", " ").split())
        assert "validation passed (4/4)" in out, out
        assert "kubectl -n gpu-operator logs deploy/gpu-operator" in out
        assert "operator" not in {p.name for p in state.processes}  # no host process: the chart's pod
        client = Client(KubeConfig.from_file(state.kubeconfig))
        (pod,) = client.list(Pod, namespace="gpu-operator", labels={"app": "gpu-operator"})
        assert pod.spec is not None and pod.spec.nodeName == "real-node-0"
        client.close()
    finally:
        down = sim("down", "--dir", str(where))
    assert down.returncode == 0, down.stderr
    assert processes_mentioning(where) == []
