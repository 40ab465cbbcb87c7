"""containerd itself (the binary the real node runs, `containerd config dump`: its own loader, with
imports and version migration) reads the config k3s regenerates at start from the template the
toolkit stand-in wrote for the k3s toolkit DaemonSet: the `nvidia` runtime is there, with the
toolkit's binary; with the stock DaemonSet's /etc/containerd paths it is not. No daemon, kubelet or
k3s runs: k3s' regeneration is played by `sim.toolkitconfig.k3s_start`."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from gpu_operator.render.states.container_toolkit import STATE
from gpu_operator.sim.realnode.realspec import RUNTIME_FILES
from gpu_operator.sim.standins.toolkitconfig import channel, configure, k3s_start
from tests.unit.render.renderkit import run

K3S = "/var/lib/rancher/k3s/agent/etc/containerd"
TOOLKIT = "nvidia-container-toolkit-daemonset"


def containerd_runtimes(tree: Path, daemonset: str) -> dict[str, Any]:
    for path, text in RUNTIME_FILES["k3s"].items():  # the k3s host: its generated config and socket
        (tree / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tree / path.lstrip("/")).write_text(text)
    ds = next(
        o
        for o in run({}, "k3s:1").state(STATE).objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == daemonset
    )
    configure(*channel(ds["spec"]["template"]["spec"]), tree)
    k3s_start(tree, K3S)
    binary = shutil.which("containerd")
    assert binary, "containerd is not on PATH: ./dev setup installs Debian's containerd"
    done = subprocess.run(
        [binary, "--config", str(tree / K3S.lstrip("/") / "config.toml"), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = tomllib.loads(done.stdout)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
        "runtimes"
    ]
    return found


def test_k3s_containerd_reads_the_runtime_the_k3s_toolkit_wrote(tmp_path: Path) -> None:
    runtimes = containerd_runtimes(tmp_path, f"{TOOLKIT}-k3s")
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"


def test_the_stock_paths_leave_k3s_containerd_without_it(tmp_path: Path) -> None:
    assert "nvidia" not in containerd_runtimes(tmp_path, TOOLKIT)
