"""Partitionable devices (KEP-4815) as NVIDIA's GPU kubelet plugin publishes them under its DynamicMIG
gate (sim/standins/drapartitions.py, sim/standins/draplugin.py): the counters' slice first, one slice per GPU with the
full GPU and every MIG placement, each consuming from the GPU's counter set; static MIG devices
destroyed when the plugin starts; the forbidden gate pairs; no MIG-capable GPU: the static form."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator import shapes
from gpu_operator.sim.hardware import mighw
from gpu_operator.sim.standins import drapartitions, draplugin
from gpu_operator.sim.standins.podwatch import PodView
from tests.unit.sim.test_dramig import Applied, applied
from tests.unit.sim.test_standins import view

GATES = {"FEATURE_GATES": "DynamicMIG=true"}


def test_the_gate_and_the_pairs_the_plugin_refuses() -> None:
    assert not drapartitions.dynamic({}) and not drapartitions.dynamic({"FEATURE_GATES": "DynamicMIG=false"})
    assert drapartitions.dynamic(GATES)
    for other in ("NVMLDeviceHealthCheck", "MPSSupport", "PassthroughSupport"):
        with pytest.raises(drapartitions.PluginRefuses, match=other):
            drapartitions.dynamic({"FEATURE_GATES": f"DynamicMIG=true,{other}=true"})
    assert (
        drapartitions.dns_name("copyEngines") == "copy-engines"
        and drapartitions.dns_name("memory") == "memory"
    )


def test_a_dgx_h100_pool_split_into_counters_and_one_slice_per_gpu() -> None:
    parts = draplugin.pool(view(), GATES, {}, None)
    assert len(parts) == 9 and list(parts[0]) == ["sharedCounters"]
    sets = parts[0]["sharedCounters"]
    assert [s["name"] for s in sets] == [f"gpu-{i}-counter-set" for i in range(8)]
    counters = sets[0]["counters"]
    assert counters["memory"] == {"value": "80Gi"} and counters["multiprocessors"] == {"value": "112"}
    assert sorted(k for k in counters if k.startswith("memory-slice-")) == [
        f"memory-slice-{i}" for i in range(8)
    ]
    gpu0 = parts[1]["devices"]
    names = [d["name"] for d in gpu0]
    assert names == sorted(names) and "gpu-0" in names and len(names) == 1 + 7 + 7 + 7 + 3 + 2 + 1 + 1
    full = next(d for d in gpu0 if d["name"] == "gpu-0")
    assert full["attributes"]["type"] == {"string": "gpu"}
    assert full["consumesCounters"] == [{"counterSet": "gpu-0-counter-set", "counters": counters}]
    one = next(d for d in gpu0 if d["name"] == "gpu-0-mig-1g10gb-19-2")
    assert one["attributes"]["type"] == {"string": "mig"} and "uuid" not in one["attributes"]
    assert one["attributes"]["parentUUID"] == full["attributes"]["uuid"]
    assert not any(k.startswith("memorySlice") for k in one["capacity"])
    consumed = one["consumesCounters"][0]
    assert consumed["counterSet"] == "gpu-0-counter-set"
    assert (
        consumed["counters"]["memory-slice-2"] == {"value": "1"}
        and "memory-slice-3" not in consumed["counters"]
    )
    assert consumed["counters"]["copy-engines"] == {"value": "1"} and consumed["counters"]["memory"] == {
        "value": "10Gi"
    }
    assert "gpu-0-mig-7g80gb-0-0" in names and "gpu-0-mig-3g40gb-9-4" in names


def test_without_a_mig_capable_gpu_the_static_form() -> None:
    a10 = view("a10", name="a10-0")
    assert draplugin.pool(a10, GATES, {}, None) == [{"devices": draplugin.devices(a10)}]


def test_the_plugin_destroys_static_mig_devices_when_it_starts() -> None:
    hw, shape = mighw.MigHardware(None), shapes.load("dgx-h100")
    hw.set("dgx-h100-0", shape, applied("all-1g.10gb"))
    player, client = draplugin.SlicePublisher(mig=hw), Applied()
    pod = PodView(
        namespace="gpu-operator",
        name="plugin",
        uid="a",
        app=draplugin.PLUGIN_APP,
        node="dgx-h100-0",
        running=True,
        started=1,
        env=dict(GATES),
    )
    asyncio.run(player.sync(client, "dgx-h100-0", view(), [pod]))  # type: ignore[arg-type]
    assert not any(g.enabled or g.instances for g in hw.gpus("dgx-h100-0", shape))
    bodies: list[dict[str, Any]] = client.bodies
    assert [b["metadata"]["name"] for b in bodies] == [f"dgx-h100-0-gpu.nvidia.com-{i}" for i in range(9)]
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in bodies} == {9}
    assert "devices" not in bodies[0]["spec"] and "sharedCounters" not in bodies[1]["spec"]


def test_a_refusing_plugin_publishes_nothing() -> None:
    player, client = draplugin.SlicePublisher(), Applied()
    pod = PodView(
        namespace="gpu-operator",
        name="plugin",
        uid="a",
        app=draplugin.PLUGIN_APP,
        node="dgx-h100-0",
        running=True,
        started=1,
        env={"FEATURE_GATES": "DynamicMIG=true,MPSSupport=true"},
    )
    asyncio.run(player.sync(client, "dgx-h100-0", view(), [pod]))  # type: ignore[arg-type]
    assert client.bodies == []
