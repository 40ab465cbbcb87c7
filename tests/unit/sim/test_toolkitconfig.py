"""The toolkit stand-in writes where the toolkit DaemonSet's env and mounts point, as NVIDIA's
toolkit does; after the distribution restarts, its containerd has the nvidia runtime only when the
DaemonSet was pointed at that distribution's paths (read back by the probe's own runtime reader)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.node.hostfs import HostFS
from gpu_operator.node.runtime import detect_runtime
from gpu_operator.render.states.container_toolkit import STATE
from gpu_operator.shapes import load
from gpu_operator.sim import hosttree
from gpu_operator.sim.realspec import distribution, host_spec
from gpu_operator.sim.toolkitconfig import channel, configure, distribution_start, to_toml
from tests.unit.render.renderkit import run

TOOLKIT = "nvidia-container-toolkit-daemonset"


def toolkit_pods(shape: str) -> dict[str, dict[str, Any]]:
    result = run({}, f"{shape}:1")
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in result.state(STATE).objects
            if o["kind"] == "DaemonSet"}


def restarted_runtime(tmp_path: Path, shape: str, pod: dict[str, Any]) -> tuple[list[str], bool]:
    tree = tmp_path / shape
    hosttree.build(host_spec(shape), tree)
    written = configure(*channel(pod), tree)
    distribution_start(tree, distribution(load(shape)))
    return written, detect_runtime(HostFS(tree)).nvidia_runtime


@pytest.mark.parametrize(("shape", "daemonset", "where"), [
    ("a10", TOOLKIT, ["/etc/containerd/conf.d/99-nvidia.toml", "/etc/containerd/config.toml"]),
    ("k3s", f"{TOOLKIT}-k3s", ["/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"]),
    ("rke2", f"{TOOLKIT}-rke2-v3", ["/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl"]),
    ("microk8s", f"{TOOLKIT}-microk8s", ["/etc/containerd/conf.d/99-nvidia.toml",
                                         "/var/snap/microk8s/current/args/containerd-template.toml"]),
    ("k0s", f"{TOOLKIT}-k0s", ["/etc/k0s/containerd.d/nvidia.toml"]),
])
def test_the_distributions_containerd_gets_the_runtime(tmp_path: Path, shape: str, daemonset: str,
                                                        where: list[str]) -> None:
    written, nvidia = restarted_runtime(tmp_path, shape, toolkit_pods(shape)[daemonset])
    assert written == where
    assert nvidia


@pytest.mark.parametrize("shape", ["k3s", "rke2", "k0s"])
def test_stock_paths_on_a_distribution_leave_its_runtime_without_nvidia(tmp_path: Path, shape: str) -> None:
    """What every node got before runtimes by distribution: the stock DaemonSet's /etc/containerd."""
    written, nvidia = restarted_runtime(tmp_path, shape, toolkit_pods(shape)[TOOLKIT])
    assert written == ["/etc/containerd/conf.d/99-nvidia.toml", "/etc/containerd/config.toml"]
    assert not nvidia


def test_toml_round_trip() -> None:
    doc = {"version": 2, "imports": ["/a.toml"], "plugins": {"io.containerd.grpc.v1.cri": {"containerd": {
        "runtimes": {"nvidia": {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": "/x"}}}}}}}
    assert tomllib.loads(to_toml(doc)) == doc
