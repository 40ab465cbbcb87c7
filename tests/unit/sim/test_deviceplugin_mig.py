"""The device-plugin stand-in with MIG, over its gRPC API in-process (the real node's kubelet is not
part of this test): a DGX H100 host tree where GPU 0 has two 1g.10gb MIG devices and the others
MIG off. With MIG_STRATEGY=mixed it serves `nvidia.com/gpu` (the 7 full GPUs) and
`nvidia.com/mig-1g.10gb` (2 devices) on their own sockets; Allocate hands out MIG UUIDs as NVIDIA's
plugin does, and the `nvidia` runtime gives each container the parent GPU and exactly its MIG
device's cap nodes; a third MIG device does not exist to hand out (the kubelet keeps a third pod
Pending); with `single` the plugin refuses the mixed layout and exits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpu_operator import shapes
from gpu_operator.sim.hardware import hosttree, mighw, migparted, migtree
from gpu_operator.sim.hardware.faults import node_host_spec
from gpu_operator.sim.realnode import nvruntime
from gpu_operator.sim.realnode.toolkit import gpus
from gpu_operator.sim.standins import deviceplugin, dpapi, migresources
from tests.unit.sim.test_deviceplugin import run

MIG = "nvidia.com/mig-1g.10gb"
LAYOUT = yaml.safe_dump(
    {
        "version": "v1",
        "mig-configs": {
            "two-on-gpu0": [
                {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2}},
                {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False},
            ]
        },
    }
)


def two_on_gpu0(root: Path) -> Path:
    """A DGX H100 host tree at `root` (driver loaded) with LAYOUT applied, as the MIG manager leaves it."""
    hosttree.build(node_host_spec("dgx-h100"), root)
    entries = migparted.select(migparted.parse(LAYOUT), "two-on-gpu0")
    migtree.save_tree_state(root, migparted.apply(entries, mighw.shape_gpus(shapes.load("dgx-h100"))))
    return root


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return two_on_gpu0(tmp_path / "node" / "root")


def call(socket: Path, method: str, request: Any, response: str) -> Any:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        fn = channel.unary_unary(
            f"/{dpapi.PLUGIN_SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=dpapi.message(response).FromString,
        )
        return fn(request, timeout=5)


def allocate(socket: Path, ids: list[str]) -> Any:
    req = dpapi.message("AllocateRequest")()
    req.container_requests.add(devices_ids=ids)
    return call(socket, "Allocate", req, "AllocateResponse").container_responses[0]


def injected(host: Path, answer: Any) -> set[str]:
    """The device nodes the `nvidia` runtime gives a container the kubelet created with `answer`."""
    env = [f"{k}={v}" for k, v in answer.envs.items()]
    config: dict[str, Any] = {"process": {"env": env}, "mounts": [], "annotations": dict(answer.annotations)}
    nvruntime.inject(config, host)
    return {m["destination"] for m in config["mounts"] if m["destination"].startswith("/dev/")}


def test_mixed_strategy_serves_each_resource_and_hands_out_one_mig_device_each(
    host: Path, tmp_path: Path
) -> None:
    plugins = deviceplugin.plugins_for(host, "envvar", "mixed")
    assert [(p.resource, p.socket, len(p.advertised())) for p in plugins] == [
        ("nvidia.com/gpu", "nvidia-gpu.sock", 7),
        (MIG, "nvidia-mig-1g.10gb.sock", 2),
    ]
    mig_plugin = plugins[1]
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    state = migtree.tree_state(host)
    assert state is not None
    expected = [state[0].mig_uuid(i) for i in state[0].instances]
    for kubelet in run(mig_plugin, plugin_dir):
        request = kubelet.requests.get(timeout=10)
        assert (request.endpoint, request.resource_name) == ("nvidia-mig-1g.10gb.sock", MIG)
        socket = plugin_dir / mig_plugin.socket
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            watch = channel.unary_stream(
                f"/{dpapi.PLUGIN_SERVICE}/ListAndWatch",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=dpapi.message("ListAndWatchResponse").FromString,
            )
            stream = watch(deviceplugin.Empty(), timeout=30)
            assert [(d.ID, d.health) for d in next(stream).devices] == [(u, "Healthy") for u in expected]
            stream.cancel()
        first, second = allocate(socket, [expected[0]]), allocate(socket, [expected[1]])
        assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": expected[0]}
        assert dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": expected[1]}
        minor = {g.index: g.minor for g in gpus(host)}[0]
        others = {f"/dev/nvidia{g.minor}" for g in gpus(host) if g.index != 0}
        caps = [{p for p, _ in migtree.access_nodes(minor, inst)} for inst in state[0].instances]
        seen_first, seen_second = injected(host, first), injected(host, second)
        # the parent GPU and exactly its own MIG device's caps: one MIG device each, never the other's
        assert f"/dev/nvidia{minor}" in seen_first and caps[0] <= seen_first and not caps[1] & seen_first
        assert f"/dev/nvidia{minor}" in seen_second and caps[1] <= seen_second and not caps[0] & seen_second
        assert not others & (seen_first | seen_second)
        with pytest.raises(grpc.RpcError) as refused:  # there is no third 1g.10gb device to hand out
            allocate(socket, [state[1].uuid])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cdi_names_of_mig_devices_resolve_to_the_parent_and_its_caps(host: Path) -> None:
    mig_plugin = deviceplugin.GpuPlugin(host, "cdi-annotations", resource=MIG, mig_strategy="mixed")
    device_id = mig_plugin.advertised()[1][0]
    mig_plugin.write_cdi_spec()
    config: dict[str, Any] = {
        "process": {"env": []},
        "mounts": [],
        "annotations": {"cdi.k8s.io/nvidia-device-plugin_x": f"{deviceplugin.CDI_KIND}={device_id}"},
    }
    nvruntime.inject(config, host)
    found = migtree.mig_device(host, device_id)
    assert found is not None
    devices = {m["destination"] for m in config["mounts"] if m["destination"].startswith("/dev/")}
    assert {p for p, _ in migtree.access_nodes(0, found[1])} <= devices and "/dev/nvidia0" in devices


def test_single_strategy_refuses_a_mixed_layout_as_nvidias_plugin(host: Path) -> None:
    with pytest.raises(migresources.PluginError, match="same migEnabled value"):
        deviceplugin.plugins_for(host, "envvar", "single")
    with pytest.raises(SystemExit, match="same migEnabled value"):
        deviceplugin.main(["--host-root", str(host), "--plugin-dir", str(host), "--mig-strategy", "single"])
    # strategy none: every GPU a full GPU, whatever its MIG mode
    (plain,) = deviceplugin.plugins_for(host, "envvar", "none")
    assert (plain.resource, len(plain.advertised())) == ("nvidia.com/gpu", 8)
