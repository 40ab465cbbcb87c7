"""The DRA kubelet-plugin stand-in's device taints (sim/standins/drahealth.py, sim/standins/draplugin.py): an Xid in the
node's host tree taints that GPU's device in the ResourceSlice only with NVMLDeviceHealthCheck, as
NVIDIA's plugin does; the device stays; a new boot or plugin pod starts clean."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpu_operator import shapes
from gpu_operator.sim.hardware.faults import NodeHosts, node_host_spec
from gpu_operator.sim.standins import drahealth, draplugin
from gpu_operator.sim.standins.podwatch import StandinNodeView
from tests.unit.sim.test_standins import pod

NODE = "dgx-h100-0"
GATE = {"FEATURE_GATES": "NVMLDeviceHealthCheck=true"}


def view() -> StandinNodeView:
    return StandinNodeView(
        name=NODE,
        uid="node-uid",
        labels={shapes.SHAPE_LABEL: "dgx-h100"},
        capacity={},
        shape=shapes.load("dgx-h100"),
    )


class Applied:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def create(self, obj: Any, field_manager: str | None = None) -> None:
        await self.apply(obj, field_manager)  # the plugin creates (a fake never says it exists)

    async def apply(self, obj: Any, field_manager: str | None = None, force: bool = False) -> None:
        self.bodies.append(obj.to_dict())

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for d in self.bodies[-1]["spec"]["devices"]}


def test_the_gate_and_the_skipped_xids_are_read_as_the_plugin_reads_them() -> None:
    assert drahealth.gate_on({"FEATURE_GATES": "MPSSupport=true,NVMLDeviceHealthCheck=true"})
    assert not drahealth.gate_on({"FEATURE_GATES": "NVMLDeviceHealthCheck=false"}) and not drahealth.gate_on(
        {}
    )
    assert drahealth.skipped({"ADDITIONAL_XIDS_TO_IGNORE": "48, x,94"}) == {13, 31, 43, 45, 68, 109, 48, 94}


def test_devices_carry_their_pci_bus_id() -> None:
    found = draplugin.devices(view())
    assert found[0]["attributes"][draplugin.PCI_BUS_ID] == {"string": "0000:41:00.0"}
    assert found[1]["attributes"][draplugin.PCI_BUS_ID] == {"string": "0000:42:00.0"}
    assert all("taints" not in d for d in found)


def run_sync(
    player: draplugin.SlicePublisher, client: Applied, env: dict[str, str], uid: str = "pod-uid"
) -> None:
    asyncio.run(player.sync(client, NODE, view(), [pod(env=env, uid=uid)]))  # type: ignore[arg-type]


def test_an_xid_taints_the_device_which_stays_in_the_slice(tmp_path: Path) -> None:
    hosts = NodeHosts(tmp_path)
    player, client = draplugin.SlicePublisher(hosts=tmp_path), Applied()
    run_sync(player, client, GATE)  # the plugin starts before the fault
    assert len(client.bodies) == 1 and all("taints" not in d for d in client.devices().values())
    faults = hosts.faults(NODE, node_host_spec("dgx-h100"))
    faults.xid(79, 1)
    run_sync(player, client, GATE)
    devices = client.devices()
    assert len(devices) == 8  # tainted, not dropped
    assert devices["gpu-1"]["taints"] == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    ]
    assert [n for n, d in devices.items() if "taints" in d] == ["gpu-1"]
    run_sync(player, client, GATE)
    assert len(client.bodies) == 2  # nothing new: no write
    faults.xid(13, 1)  # an application Xid replaces the taint of that key: effect None, as the plugin does
    run_sync(player, client, GATE)
    assert client.devices()["gpu-1"]["taints"] == [
        {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}
    ]
    faults.xid(48, 2)
    run_sync(player, client, GATE, uid="new-pod")  # a new plugin pod: no taint, Xids from its start
    assert all("taints" not in d for d in client.devices().values())
    faults.xid(48, 2)
    run_sync(player, client, GATE, uid="new-pod")
    assert client.devices()["gpu-2"]["taints"][0]["value"] == "48"
    faults.clear()  # a reboot: a new plugin process
    run_sync(player, client, GATE, uid="new-pod")
    assert all("taints" not in d for d in client.devices().values())


def test_without_the_gate_no_device_is_tainted(tmp_path: Path) -> None:
    player, client = draplugin.SlicePublisher(hosts=tmp_path), Applied()
    run_sync(player, client, {})
    NodeHosts(tmp_path).faults(NODE, node_host_spec("dgx-h100")).xid(79, 0)
    run_sync(player, client, {})
    assert len(client.bodies) == 1 and all("taints" not in d for d in client.devices().values())
