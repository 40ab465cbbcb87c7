"""The device-plugin stand-in with a time-slicing config (the file NVIDIA's config-manager links,
CONFIG_FILE), over its gRPC API: each GPU is `replicas` devices `<UUID>::<i>`; two allocations
of replicas of one GPU each get that GPU (the `nvidia` runtime gives both containers its device
node); failRequestsGreaterThanOne refuses two replicas in one request; SIGHUP (config-manager's
signal) restarts the plugin with the file read afresh, registering the renamed resource."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpu_operator.sim.realnode import nvruntime
from gpu_operator.sim.realnode.toolkit import gpus
from gpu_operator.sim.standins import deviceplugin, dpapi, sharing
from tests.unit.sim.test_deviceplugin import FakeKubelet, run
from tests.unit.sim.test_sharing import SLICE2_RENAMED as SHARED2
from tests.unit.sim.test_sharing import SLICE4


def allocate(plugin_dir: Path, ids: list[str], socket: str = deviceplugin.SOCKET) -> Any:
    req = dpapi.message("AllocateRequest")()
    req.container_requests.add(devices_ids=ids)
    with grpc.insecure_channel(f"unix://{plugin_dir / socket}") as channel:
        fn = channel.unary_unary(
            f"/{dpapi.PLUGIN_SERVICE}/Allocate",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=dpapi.message("AllocateResponse").FromString,
        )
        return fn(req, timeout=5).container_responses[0]


def device_nodes(host: Path, answer: Any) -> set[str]:
    config: dict[str, Any] = {
        "process": {"env": [f"{k}={v}" for k, v in answer.envs.items()]},
        "mounts": [],
        "annotations": dict(answer.annotations),
    }
    nvruntime.inject(config, host)
    return {
        m["destination"]
        for m in config["mounts"]
        if m["destination"].startswith("/dev/nvidia") and m["destination"][len("/dev/nvidia") :].isdigit()
    }


def test_time_slicing_replicas_share_one_gpu(host: Path, plugin_dir: Path, tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(SLICE4)
    config = deviceplugin.load_config(str(config_file))
    (plugin,) = deviceplugin.plugins_for(host, "envvar", "none", config)
    found = gpus(host)
    assert [i for i, _ in plugin.advertised()] == [f"{g.uuid}::{n}" for g in found for n in range(4)]
    for kubelet in run(plugin, plugin_dir):
        assert kubelet.requests.get(timeout=10).resource_name == "nvidia.com/gpu"
        first = allocate(plugin_dir, [f"{found[0].uuid}::0"])
        second = allocate(plugin_dir, [f"{found[0].uuid}::1"])
        assert dict(first.envs) == dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": found[0].uuid}
        assert device_nodes(host, first) == device_nodes(host, second) == {f"/dev/nvidia{found[0].minor}"}
        both = allocate(plugin_dir, [f"{found[0].uuid}::2", f"{found[0].uuid}::3"])  # allowed: each GPU once
        assert dict(both.envs) == {"NVIDIA_VISIBLE_DEVICES": found[0].uuid}
        with pytest.raises(grpc.RpcError) as refused:
            allocate(plugin_dir, [f"{found[0].uuid}::9"])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_fail_requests_greater_than_one_and_a_bad_file(host: Path, tmp_path: Path) -> None:
    (plugin,) = deviceplugin.plugins_for(host, "envvar", "none", sharing.parse(SHARED2))
    assert plugin.resource == "nvidia.com/gpu.shared" and plugin.socket == "nvidia-gpu.shared.sock"
    dp = tmp_path / "dp2"
    dp.mkdir()
    uuid = gpus(host)[0].uuid
    for kubelet in run(plugin, dp):
        assert kubelet.requests.get(timeout=10).resource_name == "nvidia.com/gpu.shared"
        with pytest.raises(grpc.RpcError) as refused:
            allocate(dp, [f"{uuid}::0", f"{uuid}::1"], plugin.socket)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(sharing.SharingConfigError, match="unable to parse config file"):
        deviceplugin.load_config(str(tmp_path / "missing.yaml"))
    assert deviceplugin.load_config("") == sharing.Sharing()


def test_sighup_restarts_with_the_file_read_again(host: Path, plugin_dir: Path, tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(SLICE4)
    kubelet = FakeKubelet(plugin_dir)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_operator.sim.standins.deviceplugin",
            f"--host-root={host}",
            f"--plugin-dir={plugin_dir}",
            f"--config-file={config_file}",
        ],
        env={**os.environ, "MIG_STRATEGY": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert kubelet.requests.get(timeout=30).resource_name == "nvidia.com/gpu"
        config_file.write_text(SHARED2)  # what config-manager's relink shows the process
        proc.send_signal(signal.SIGHUP)
        again = kubelet.requests.get(timeout=30)
        assert (again.resource_name, again.endpoint) == ("nvidia.com/gpu.shared", "nvidia-gpu.shared.sock")
        assert not (plugin_dir / deviceplugin.SOCKET).exists()  # the old server stopped
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
        kubelet.stop()
    assert proc.returncode == 0  # SIGTERM: a clean stop
