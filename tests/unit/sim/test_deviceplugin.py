"""The device-plugin stand-in over gRPC on unix sockets, with a kubelet's Registration service
played by the test: registration (and again after a kubelet restart), ListAndWatch with health,
Allocate by strategy, preferred allocation; its CDI answer resolved by the `nvidia` runtime; the
health NVIDIA's plugin reports for Xids and a GPU off the bus (`sim fault`), Healthy after a reboot."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpu_operator.sim.hardware import faults
from gpu_operator.sim.realnode import nvruntime
from gpu_operator.sim.realnode.toolkit import gpus
from gpu_operator.sim.standins import deviceplugin, dpapi
from gpu_operator.sim.standins.xidhealth import XidFilter


class FakeKubelet:
    """The kubelet's Registration service on <dir>/kubelet.sock, recording what registers."""

    def __init__(self, plugin_dir: Path) -> None:
        self.requests: queue.Queue[Any] = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def register(request: Any, context: Any) -> Any:
            self.requests.put(request)
            return deviceplugin.Empty()

        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    f"{dpapi.VERSION}.Registration",
                    {
                        "Register": grpc.unary_unary_rpc_method_handler(
                            register,
                            request_deserializer=dpapi.message("RegisterRequest").FromString,
                            response_serializer=lambda m: m.SerializeToString(),
                        )
                    },
                ),
            )
        )
        self.server.add_insecure_port(f"unix://{plugin_dir / dpapi.KUBELET_SOCKET}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


def run(plugin: deviceplugin.GpuPlugin, plugin_dir: Path) -> Iterator[FakeKubelet]:
    kubelet = FakeKubelet(plugin_dir)
    thread = threading.Thread(
        target=deviceplugin.serve, args=(plugin, plugin_dir, lambda _m: None), daemon=True
    )
    thread.start()
    try:
        yield kubelet
    finally:
        plugin.stopping.set()
        thread.join(10)
        kubelet.stop()
        assert not thread.is_alive()


def call(plugin_dir: Path, method: str, request: Any, response: str) -> Any:
    with grpc.insecure_channel(f"unix://{plugin_dir / deviceplugin.SOCKET}") as channel:
        fn = channel.unary_unary(
            f"/{dpapi.PLUGIN_SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=dpapi.message(response).FromString,
        )
        return fn(request, timeout=5)


def test_registers_lists_watches_health_and_allocates(host: Path, plugin_dir: Path) -> None:
    plugin = deviceplugin.GpuPlugin(host)
    for kubelet in run(plugin, plugin_dir):
        request = kubelet.requests.get(timeout=10)
        assert (request.version, request.endpoint, request.resource_name) == (
            "v1beta1",
            "nvidia-gpu.sock",
            "nvidia.com/gpu",
        )
        assert request.options.get_preferred_allocation_available
        uuids = [g.uuid for g in gpus(host)]

        with grpc.insecure_channel(f"unix://{plugin_dir / deviceplugin.SOCKET}") as channel:
            watch = channel.unary_stream(
                f"/{dpapi.PLUGIN_SERVICE}/ListAndWatch",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=dpapi.message("ListAndWatchResponse").FromString,
            )
            stream = watch(deviceplugin.Empty(), timeout=30)
            first = next(stream)
            assert [(d.ID, d.health) for d in first.devices] == [(u, "Healthy") for u in uuids]
            (host / "dev/nvidia1").unlink()  # the GPU's device node is gone: unhealthy
            second = next(stream)
            assert [(d.ID, d.health) for d in second.devices] == [
                (uuids[0], "Healthy"),
                (uuids[1], "Unhealthy"),
            ]
            stream.cancel()

        req = dpapi.message("AllocateRequest")()
        req.container_requests.add(devices_ids=[uuids[1]])
        answer = call(plugin_dir, "Allocate", req, "AllocateResponse")
        assert dict(answer.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": uuids[1]}
        bad = dpapi.message("AllocateRequest")()
        bad.container_requests.add(devices_ids=["GPU-nope"])
        with pytest.raises(grpc.RpcError) as refused:
            call(plugin_dir, "Allocate", bad, "AllocateResponse")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "GPU-nope" in (
            refused.value.details() or ""
        )

        pref = dpapi.message("PreferredAllocationRequest")()
        pref.container_requests.add(
            available_deviceIDs=list(reversed(uuids)), must_include_deviceIDs=[uuids[1]], allocation_size=2
        )
        chosen = call(plugin_dir, "GetPreferredAllocation", pref, "PreferredAllocationResponse")
        assert list(chosen.container_responses[0].deviceIDs) == [uuids[1], uuids[0]]


def test_registers_again_after_a_kubelet_restart(host: Path, plugin_dir: Path) -> None:
    plugin = deviceplugin.GpuPlugin(host)
    for kubelet in run(plugin, plugin_dir):
        kubelet.requests.get(timeout=10)
        kubelet.stop()  # a restarting kubelet removes its socket and every plugin's
        (plugin_dir / dpapi.KUBELET_SOCKET).unlink(missing_ok=True)
        (plugin_dir / deviceplugin.SOCKET).unlink(missing_ok=True)
        time.sleep(0.2)
        again = FakeKubelet(plugin_dir)
        try:
            assert again.requests.get(timeout=10).resource_name == "nvidia.com/gpu"
            assert (plugin_dir / deviceplugin.SOCKET).exists()
        finally:
            again.stop()


def test_cdi_annotations_strategy_is_resolved_by_the_nvidia_runtime(host: Path, plugin_dir: Path) -> None:
    plugin = deviceplugin.GpuPlugin(host, strategy="cdi-annotations")
    for kubelet in run(plugin, plugin_dir):
        kubelet.requests.get(timeout=10)
        uuid1 = gpus(host)[1].uuid
        req = dpapi.message("AllocateRequest")()
        req.container_requests.add(devices_ids=[uuid1])
        answer = call(plugin_dir, "Allocate", req, "AllocateResponse").container_responses[0]
        assert not answer.envs
        ((key, value),) = answer.annotations.items()
        assert (
            key.startswith("cdi.k8s.io/nvidia-device-plugin_") and value == f"{deviceplugin.CDI_KIND}={uuid1}"
        )
        # the kubelet puts the annotation on the container; containerd passes it to the runtime
        config: dict[str, Any] = {"process": {"env": []}, "mounts": [], "annotations": {key: value}}
        nvruntime.inject(config, host)
        devices = {m["destination"] for m in config["mounts"]}
        assert "/dev/nvidia1" in devices and "/dev/nvidia0" not in devices and "/dev/nvidiactl" in devices


def test_an_unknown_strategy_is_refused_with_the_choices(host: Path) -> None:
    with pytest.raises(ValueError, match="use one of envvar, cdi-annotations"):
        deviceplugin.GpuPlugin(host, strategy="volume-mounts")


def test_xid_filter_follows_nvidia_rules() -> None:
    default = XidFilter({})
    assert [x for x in (13, 31, 43, 45, 48, 68, 79, 109) if default.counts(x)] == [48, 79]
    more = XidFilter({"DP_DISABLE_HEALTHCHECKS": "48, nope,"})
    assert not more.counts(48) and more.counts(79) and not more.all_disabled
    assert XidFilter({"DP_DISABLE_HEALTHCHECKS": "xids"}).all_disabled
    enabled = XidFilter({"DP_ENABLE_HEALTHCHECKS": "13"})
    assert enabled.counts(13) and not enabled.counts(31)
    every = XidFilter({"DP_ENABLE_HEALTHCHECKS": "all"})
    assert all(every.counts(x) for x in (13, 31, 109, 79))


def test_listandwatch_reports_xids_and_a_lost_gpu_unhealthy_until_a_new_boot(
    host: Path, plugin_dir: Path, tmp_path: Path
) -> None:
    node = faults.HostFaults(host, tmp_path / "book")
    node.xid(79, 0)  # before the plugin started: not its event
    plugin = deviceplugin.GpuPlugin(host, env={})
    for kubelet in run(plugin, plugin_dir):
        kubelet.requests.get(timeout=10)
        uuids = [g.uuid for g in gpus(host)]
        with grpc.insecure_channel(f"unix://{plugin_dir / deviceplugin.SOCKET}") as channel:
            watch = channel.unary_stream(
                f"/{dpapi.PLUGIN_SERVICE}/ListAndWatch",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=dpapi.message("ListAndWatchResponse").FromString,
            )
            stream = watch(deviceplugin.Empty(), timeout=60)

            def health(stream: Any = stream) -> list[tuple[str, str]]:
                return [(d.ID, d.health) for d in next(stream).devices]

            assert health() == [(uuids[0], "Healthy"), (uuids[1], "Healthy")]
            node.xid(13, 0)  # an application Xid: ignored (had it counted, GPU 0 would turn Unhealthy first)
            node.xid(48, 1)
            assert health() == [(uuids[0], "Healthy"), (uuids[1], "Unhealthy")]
            node.clear()  # a new boot: a new plugin process, every GPU Healthy
            assert health() == [(uuids[0], "Healthy"), (uuids[1], "Healthy")]
            node.gone(0)  # off the bus: still listed, Unhealthy
            assert health() == [(uuids[0], "Unhealthy"), (uuids[1], "Healthy")]
            node.clear()
            assert health() == [(uuids[0], "Healthy"), (uuids[1], "Healthy")]
            stream.cancel()
