"""The DRA kubelet plugin's stand-in publishes static MIG devices as NVIDIA's GPU kubelet plugin does
(sim/standins/dramig.py, sim/standins/draplugin.py): all-1g.10gb on a DGX H100 (8 GPUs x 7 MIG devices, no full GPU),
MIG off (the 8 GPUs), and a layout taken when the plugin's pod starts, not while it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpu_operator import shapes
from gpu_operator.render.states.mig_manager import default_mig_config
from gpu_operator.sim.hardware import mighw, migparted
from gpu_operator.sim.standins import dramig, draplugin
from gpu_operator.sim.standins.podwatch import PodView
from tests.unit.sim.test_standins import view

SHAPE = shapes.load("dgx-h100")


def applied(name: str) -> list[migparted.GpuMig]:
    return migparted.apply(
        migparted.select(migparted.parse(default_mig_config()), name), mighw.shape_gpus(SHAPE)
    )


def test_all_1g_10gb_publishes_seven_mig_devices_per_gpu_and_no_full_gpu() -> None:
    gpus = applied("all-1g.10gb")
    found = draplugin.devices(view(), gpus=gpus)
    assert len(found) == 56
    assert all(d["attributes"]["type"] == {"string": "mig"} for d in found)
    names = [d["name"] for d in found]
    assert names[:7] == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
    assert sorted(names) == sorted(f"gpu-{g}-mig-1g10gb-19-{s}" for g in range(8) for s in range(7))
    full = {d["name"]: d for d in draplugin.devices(view())}
    for device in found:
        gpu = int(device["name"].split("-")[1])
        attrs, parent = device["attributes"], full[f"gpu-{gpu}"]["attributes"]
        assert attrs["parentUUID"] == parent["uuid"] == {"string": gpus[gpu].uuid}
        assert attrs["profile"] == {"string": "1g.10gb"}
        assert attrs["uuid"]["string"].startswith("MIG-")
        for key in (
            "productName",
            "brand",
            "architecture",
            "cudaComputeCapability",
            "driverVersion",
            "cudaDriverVersion",
            draplugin.PCI_BUS_ID,
        ):
            assert attrs[key] == parent[key], key
        assert "index" not in attrs
    assert len({d["attributes"]["uuid"]["string"] for d in found}) == 56
    first = next(d for d in found if d["name"] == "gpu-0-mig-1g10gb-19-3")
    assert first["capacity"] == {
        "multiprocessors": {"value": "16"},
        "copyEngines": {"value": "1"},
        "decoders": {"value": "1"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "0"},
        "ofaEngines": {"value": "0"},
        "memory": {"value": "10Gi"},
        "memorySlice3": {"value": "1"},
    }


def test_mig_off_publishes_the_gpus_with_their_nvml_uuids() -> None:
    for gpus in (applied("all-disabled"), None):
        found = draplugin.devices(view(), gpus=gpus)
        assert [d["name"] for d in found] == [f"gpu-{i}" for i in range(8)]
        assert all(d["attributes"]["type"] == {"string": "gpu"} and "capacity" not in d for d in found)
        assert [d["attributes"]["uuid"]["string"] for d in found] == [g.uuid for g in mighw.shape_gpus(SHAPE)]


def test_a_larger_profile_and_mig_on_without_instances() -> None:
    found = draplugin.devices(view(), gpus=applied("all-3g.40gb"))
    assert [d["name"] for d in found if d["name"].startswith("gpu-0-")] == [
        "gpu-0-mig-3g40gb-9-0",
        "gpu-0-mig-3g40gb-9-4",
    ]
    second = next(d for d in found if d["name"] == "gpu-0-mig-3g40gb-9-4")
    assert second["capacity"]["memory"] == {"value": "40Gi"} and second["capacity"]["multiprocessors"] == {
        "value": "48"
    }
    assert sorted(k for k in second["capacity"] if k.startswith("memorySlice")) == [
        f"memorySlice{i}" for i in range(4, 8)
    ]
    empty = [
        migparted.GpuMig(g.index, g.device_id, g.uuid, enabled=(g.index == 0))
        for g in mighw.shape_gpus(SHAPE)
    ]
    assert [d["name"] for d in draplugin.devices(view(), gpus=empty)] == [f"gpu-{i}" for i in range(1, 8)]
    assert (
        dramig.device_name(0, migparted.Instance(dramig_profile("1g.10gb+me"), 5, 12))
        == "gpu-0-mig-1g10gb-me-20-5"
    )


def dramig_profile(name: str) -> Any:
    from gpu_operator.sim.hardware import migprofiles

    model = migprofiles.model("2330")
    assert model is not None
    found = model.profile(name)
    assert found is not None
    return found


def test_quantities_as_kubernetes_writes_them() -> None:
    assert [dramig.quantity(v) for v in (0, 1, 16, 1024, 10 << 30, 80 << 30, 1536)] == [
        "0",
        "1",
        "16",
        "1Ki",
        "10Gi",
        "80Gi",
        "1536",
    ]


class Applied:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def create(self, obj: Any, field_manager: str | None = None) -> None:
        await self.apply(obj, field_manager)  # the plugin creates (a fake never says it exists)

    async def apply(self, obj: Any, field_manager: str | None = None, force: bool = False) -> None:
        self.bodies.append(obj.to_dict())


def test_the_layout_is_read_when_the_plugin_starts(tmp_path: Path) -> None:
    hw = mighw.MigHardware(None)
    player, client = draplugin.SlicePublisher(mig=hw), Applied()

    def sync(uid: str) -> list[str]:
        pod = PodView(
            namespace="gpu-operator",
            name="plugin",
            uid=uid,
            app=draplugin.PLUGIN_APP,
            node="dgx-h100-0",
            running=True,
            started=1,
        )
        asyncio.run(player.sync(client, "dgx-h100-0", view(), [pod]))  # type: ignore[arg-type]
        return [d["name"] for d in client.bodies[-1]["spec"]["devices"]]

    assert len(sync("a")) == 8
    hw.set("dgx-h100-0", SHAPE, applied("all-1g.10gb"))
    assert len(sync("a")) == 8  # the running plugin enumerated the GPUs when it started
    assert (
        len(sync("b")) == 56 and sync("b")[0] == "gpu-0-mig-1g10gb-19-0"
    )  # a new plugin pod sees the MIG devices


def test_an_xid_on_a_mig_enabled_gpu_taints_none_of_its_mig_devices() -> None:
    """NVIDIA's plugin keys health events by (parent UUID, GI, CI); a whole-GPU event (GI = CI =
    0xFFFFFFFF, what an Xid line naming only the PCI address stands for) finds no allocatable device
    on a GPU with MIG on, since the full GPU is not published there, and is ignored. The GPU beside it
    with MIG off is tainted."""
    gpus = applied("all-1g.10gb")
    gpus[1] = mighw.shape_gpus(SHAPE)[1]  # GPU 1 with MIG off
    addresses = [d["attributes"][draplugin.PCI_BUS_ID]["string"] for d in draplugin.devices(view())]
    taint = {"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}
    taints = {addresses[i].rsplit(".", 1)[0]: taint for i in (0, 1)}
    found = draplugin.devices(view(), taints, gpus=gpus)
    mig_on = [d for d in found if d["attributes"]["type"] == {"string": "mig"}]
    assert len(mig_on) == 49 and not any("taints" in d for d in mig_on)
    (full,) = [d for d in found if d["attributes"]["type"] == {"string": "gpu"}]
    assert full["name"] == "gpu-1" and full["taints"] == [taint]
