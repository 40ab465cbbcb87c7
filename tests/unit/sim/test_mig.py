"""The simulator's MIG parts without a cluster: a layout checked against the GPU model's profiles,
mig-parted's config and its selection per GPU, the device plugin's resources and GFD's labels per
MIG strategy, the driver's MIG files in a host tree, the MIG manager's label changes and where it
reads its config from the pod the operator renders."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from gpu_operator import shapes
from gpu_operator.render.states.mig_manager import default_mig_config
from gpu_operator.sim.hardware import devnodes, hosttree, mighw, migparted, migprofiles, migtree
from gpu_operator.sim.hardware.faults import node_host_spec
from gpu_operator.sim.realnode.toolkit import gpus as tree_gpus
from gpu_operator.sim.standins import kubeletdp, migmanager, migresources
from gpu_operator.sim.standins.podwatch import PodView
from tests.unit.sim.test_standins import FakeClient, view

H100 = migprofiles.model("0x233010DE")
GOLDEN = Path(__file__).parents[1] / "render/golden/state-mig-manager/container-host-driver--a10.yaml"


def gpus() -> list[migparted.GpuMig]:
    return mighw.shape_gpus(shapes.load("dgx-h100"))


def applied(name: str, config: str | None = None) -> list[migparted.GpuMig]:
    entries = migparted.select(migparted.parse(config or default_mig_config()), name)
    return migparted.apply(entries, gpus())


def test_h100_layouts_fit_or_are_refused_by_its_profiles() -> None:
    assert H100 is not None and migprofiles.model("2330") is H100 and migprofiles.model("1eb8") is None
    assert len(migprofiles.place(H100, {"1g.10gb": 7})) == 7
    balanced = migprofiles.place(H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    # largest first, each at its first free placement: 3g at 0-2, 2g at 4-5, 1g at 3 and 6
    assert sorted((p.name, s) for p, s in balanced) == [
        ("1g.10gb", 3),
        ("1g.10gb", 6),
        ("2g.20gb", 4),
        ("3g.40gb", 0),
    ]
    with pytest.raises(migprofiles.LayoutError, match="at most 7 fit"):
        migprofiles.place(H100, {"1g.10gb": 8})
    with pytest.raises(migprofiles.LayoutError, match="'1g.5gb' does not exist"):
        migprofiles.place(H100, {"1g.5gb": 7})
    with pytest.raises(migprofiles.LayoutError, match="memory slices"):
        migprofiles.place(H100, {"3g.40gb": 2, "1g.10gb": 1})
    with pytest.raises(migprofiles.LayoutError, match="compute slices"):
        migprofiles.place(H100, {"4g.40gb": 1, "2g.20gb": 2})  # 8 slots' worth on 7


def test_the_rendered_config_selects_per_gpu_and_applies() -> None:
    one = applied("all-1g.10gb")
    assert [g.layout() for g in one] == [(True, {"1g.10gb": 7})] * 8
    assert [i.gi for i in one[0].instances] == [7, 8, 9, 10, 11, 12, 13]
    assert len({one[0].mig_uuid(i) for i in one[0].instances}) == 7
    assert all(g.uuid == hosttree.gpu_uuid(f"0000:{0x41 + g.index:02x}:00.0") for g in one)
    assert [g.layout() for g in applied("all-disabled")] == [(False, {})] * 8
    assert [g.layout() for g in applied("all-enabled")] == [(True, {})] * 8
    entries = migparted.select(migparted.parse(default_mig_config()), "all-balanced")
    assert migparted.mode_change(entries, gpus()) and not migparted.applied(entries, gpus())
    assert migparted.applied(entries, migparted.apply(entries, gpus()))
    with pytest.raises(migprofiles.LayoutError):
        applied("all-1g.5gb")  # an A100 layout: not the H100's
    with pytest.raises(migparted.MIGConfigError, match="no-such: no such config"):
        applied("no-such")


def test_device_filters_and_indices_pick_the_gpus() -> None:
    config = yaml.safe_dump(
        {
            "version": "v1",
            "mig-configs": {
                "split": [
                    {
                        "device-filter": ["0x20B010DE"],
                        "devices": "all",
                        "mig-enabled": True,
                        "mig-devices": {"1g.5gb": 7},
                    },
                    {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                    {"device-filter": "0x233010DE", "devices": [1], "mig-enabled": False},
                ]
            },
        }
    )
    got = applied("split", config)
    assert [g.layout() for g in got[:3]] == [(True, {"3g.40gb": 2}), (False, {}), (False, {})]
    assert migresources.counts("mixed", got) == {"nvidia.com/gpu": 7, "nvidia.com/mig-3g.40gb": 2}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ("version: v2\nmig-configs: {}", "version: v1"),
        ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: true}]}", "mig-configs.a[0].devices"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", "mig-configs.a[0].mig-enabled"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, device-filter: H100}]}",
            "mig-configs.a[0].device-filter",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}]}",
            "set mig-enabled: true",
        ),
    ],
)
def test_a_bad_config_names_the_field(raw: str, field: str) -> None:
    with pytest.raises(migparted.MIGConfigError) as err:
        migparted.parse(raw)
    assert field in str(err.value)


def test_device_plugin_resources_per_strategy() -> None:
    full, ones, balanced = gpus(), applied("all-1g.10gb"), applied("all-balanced")
    assert migresources.counts("none", full) == {"nvidia.com/gpu": 8}
    assert migresources.counts("none", ones) == {"nvidia.com/gpu": 8}  # none ignores MIG mode
    assert migresources.counts("single", full) == {"nvidia.com/gpu": 8}
    assert migresources.counts("single", ones) == {"nvidia.com/gpu": 56}
    assert migresources.counts("mixed", ones) == {"nvidia.com/mig-1g.10gb": 56}
    assert migresources.counts("mixed", balanced) == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8,
        "nvidia.com/mig-3g.40gb": 8,
    }
    ids = migresources.devices("single", ones)["nvidia.com/gpu"]
    assert len(set(ids)) == 56 and all(i.startswith("MIG-") for i in ids)
    with pytest.raises(migresources.PluginError, match="more than one MIG device type"):
        migresources.counts("single", balanced)
    with pytest.raises(migresources.PluginError, match="no MIG devices configured"):
        migresources.counts("single", applied("all-enabled"))
    half = ones[:4] + full[4:]
    with pytest.raises(migresources.PluginError, match="same migEnabled value"):
        migresources.counts("single", half)
    assert migresources.counts("mixed", half) == {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 28}
    assert migresources.counts("mixed", applied("all-1g.10gb.me")) == {"nvidia.com/mig-1g.10gb.me": 8}


@pytest.mark.parametrize(
    ("profile", "resource"),
    [
        ("1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("1g.10gb+me.all", "nvidia.com/mig-1g.10gb.me.all"),
        ("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx"),
        ("4g.96gb+gfx", "nvidia.com/mig-4g.96gb.gfx"),
        ("1g.24gb-me", "nvidia.com/mig-1g.24gb-me"),
        ("1c.2g.20gb", None),  # a compute-instance share: no resource of its own
    ],
)
def test_the_plugins_resource_name_of_each_profile(profile: str, resource: str | None) -> None:
    assert migresources.resource_name(profile) == resource
    if resource is not None:
        assert kubeletdp.is_plugin_resource(resource) and kubeletdp.is_plugin_resource(resource + ".shared")


@pytest.mark.parametrize("bad", ["1g.10gb+foo", "1g.10gb-gfx", "mig-1g.10gb", "1g.10gb+me+gfx", ""])
def test_a_name_that_is_no_profile_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a MIG profile name"):
        migresources.resource_name(bad)


def test_suffixed_profiles_are_resources_and_label_sets_of_their_own() -> None:
    """A GPU whose instances carry v0.20's suffixed profiles (test data: profiles of the same shape
    as the H100's 1g.10gb, under the names NVML gives suffixed ones): in mixed, one resource and one
    GFD label set per profile, each named as the plugin and GFD name it."""
    base = H100.profile("1g.10gb") if H100 else None
    assert base is not None
    names = ("1g.24gb+gfx", "1g.24gb-me", "1g.24gb+me.all", "1g.24gb")
    profiles = [
        migprofiles.Profile(
            n,
            *[
                getattr(base, f)
                for f in (
                    "slices",
                    "memory_slices",
                    "max_count",
                    "memory_mb",
                    "multiprocessors",
                    "copy",
                    "decoder",
                    "encoder",
                    "jpeg",
                    "ofa",
                    "starts",
                )
            ],
        )
        for n in names
    ]
    gpu = migparted.GpuMig(
        0, "2330", "GPU-test", True, tuple(migparted.Instance(p, i, 7 + i) for i, p in enumerate(profiles))
    )
    assert migresources.counts("mixed", [gpu]) == {
        "nvidia.com/mig-1g.24gb.gfx": 1,
        "nvidia.com/mig-1g.24gb-me": 1,
        "nvidia.com/mig-1g.24gb.me.all": 1,
        "nvidia.com/mig-1g.24gb": 1,
    }
    labels = migresources.gfd_labels(shapes.load("dgx-h100"), "mixed", [gpu])
    assert {
        k.removesuffix(".count") for k in labels if k.startswith("nvidia.com/mig-") and k.endswith(".count")
    } == {
        "nvidia.com/mig-1g.24gb.gfx",
        "nvidia.com/mig-1g.24gb-me",
        "nvidia.com/mig-1g.24gb.me.all",
        "nvidia.com/mig-1g.24gb",
    }
    assert labels["nvidia.com/mig-1g.24gb.gfx.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.24gb.gfx"
    with pytest.raises(migresources.PluginError, match="more than one MIG device type"):
        migresources.counts("single", [gpu])


def test_gfd_labels_per_strategy() -> None:
    shape = shapes.load("dgx-h100")
    ones = applied("all-1g.10gb")
    assert migresources.gfd_labels(shape, "single", gpus()) == shape.gfd_labels("single")
    single = migresources.gfd_labels(shape, "single", ones)
    assert single["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert (
        single["nvidia.com/gpu.count"],
        single["nvidia.com/gpu.replicas"],
        single["nvidia.com/gpu.memory"],
    ) == ("56", "1", "10240")
    assert (
        single["nvidia.com/gpu.multiprocessors"],
        single["nvidia.com/gpu.slices.gi"],
        single["nvidia.com/gpu.engines.copy"],
    ) == ("16", "1", "1")
    assert single["nvidia.com/mig.strategy"] == "single" and single["nvidia.com/gpu.family"] == "hopper"
    mixed = migresources.gfd_labels(shape, "mixed", applied("all-balanced"))
    assert (
        mixed["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and mixed["nvidia.com/gpu.replicas"] == "0"
    )
    assert (
        mixed["nvidia.com/mig-1g.10gb.count"],
        mixed["nvidia.com/mig-2g.20gb.count"],
        mixed["nvidia.com/mig-3g.40gb.memory"],
    ) == ("16", "8", "40960")
    assert mixed["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    invalid = migresources.gfd_labels(shape, "single", applied("all-balanced"))
    assert invalid["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert (invalid["nvidia.com/gpu.count"], invalid["nvidia.com/gpu.sharing-strategy"]) == ("0", "")
    none = migresources.gfd_labels(shape, "none", ones)
    assert "nvidia.com/mig.strategy" not in none and none["nvidia.com/gpu.count"] == "8"
    assert not any(k.startswith("nvidia.com/mig-") for k in none)


def test_the_driver_files_of_a_layout_in_the_host_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    hosttree.build(node_host_spec("dgx-h100"), root)
    minors = {g.index: g.minor for g in tree_gpus(root)}
    migtree.write_tree(root, applied("all-balanced"), minors)
    table = dict(
        line.rsplit(" ", 1) for line in (root / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    )
    assert (table["config"], table["monitor"], table["gpu0/gi1/access"], table["gpu0/gi1/ci0/access"]) == (
        "1",
        "2",
        "12",
        "13",
    )
    assert table["gpu1/gi0/access"] == str(3 + 135)
    caps = root / "proc/driver/nvidia/capabilities"
    assert sorted(p.name for p in (caps / "gpu0/mig").iterdir()) == ["gi1", "gi10", "gi13", "gi5"]
    assert (caps / "gpu0/mig/gi10/ci0/access").read_text().splitlines()[0] == f"DeviceFileMinor: {3 + 90 + 1}"
    assert devnodes.char_device(root / f"dev/nvidia-caps/nvidia-cap{3 + 90 + 1}") == (migtree.CAPS_MAJOR, 94)
    assert devnodes.char_device(root / "dev/nvidia-caps/nvidia-cap1") == (migtree.CAPS_MAJOR, 1)
    assert f"{migtree.CAPS_MAJOR} nvidia-caps" in (root / "proc/devices").read_text().splitlines()
    migtree.write_tree(root, applied("all-disabled"), minors)  # the layout's instances go with it
    assert not list(caps.glob("gpu*")) and sorted(p.name for p in (root / "dev/nvidia-caps").iterdir()) == [
        "nvidia-cap1",
        "nvidia-cap2",
    ]


def test_the_state_beside_the_host_tree(tmp_path: Path) -> None:
    shape = shapes.load("dgx-h100")
    hw = mighw.MigHardware(tmp_path / "hosts")
    assert hw.gpus("n", shape) == gpus()
    hw.set("n", shape, applied("all-1g.10gb"))
    assert mighw.MigHardware(tmp_path / "hosts").gpus("n", shape) == applied("all-1g.10gb")
    assert (tmp_path / "hosts/n/root/proc/driver/nvidia/capabilities/gpu0/mig/gi13/ci0/access").is_file()
    assert (tmp_path / "hosts/changes").read_text().split() == ["n"]


def test_the_mig_manager_pauses_and_restores_as_nvidias() -> None:
    labels = {"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm": "false"}
    paused = migmanager.deploy_changes(labels, migmanager.paused)
    assert paused["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    assert paused["nvidia.com/gpu.deploy.dcgm"] == "false"
    assert paused["nvidia.com/gpu.deploy.nvsm"] == "paused-for-mig-change"  # absent: paused too, as upstream
    assert "nvidia.com/gpu.deploy.client" not in paused
    restored = migmanager.deploy_changes(
        {**labels, **paused, "nvidia.com/gpu.deploy.client": "true"}, migmanager.restored
    )
    assert (
        restored["nvidia.com/gpu.deploy.device-plugin"] == "true"
        and restored["nvidia.com/gpu.deploy.dcgm"] == "false"
    )
    assert restored["nvidia.com/gpu.deploy.client"] == "true"


def test_the_mig_manager_reads_the_config_the_operator_renders() -> None:
    docs = [d for d in yaml.safe_load_all(GOLDEN.read_text()) if d]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    name, key = migmanager.config_source({"spec": ds["spec"]["template"]["spec"]})
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    assert "all-1g.10gb" in migparted.parse(cm["data"][key])
    custom = {
        "spec": {
            "containers": [
                {
                    "env": [{"name": "CONFIG_FILE", "value": "/cfg/config.yaml"}],
                    "volumeMounts": [{"name": "c", "mountPath": "/cfg"}],
                }
            ],
            "volumes": [{"name": "c", "configMap": {"name": "mine"}}],
        }
    }
    assert migmanager.config_source(custom) == ("mine", "config.yaml")
    with pytest.raises(migparted.MIGConfigError, match="no ConfigMap volume"):
        migmanager.config_source(
            {"spec": {"containers": [{"env": [{"name": "CONFIG_FILE", "value": "/x/c.yaml"}]}]}}
        )


def test_the_kubelet_follows_the_plugins_mig_resources() -> None:
    now = [0.0]
    shape = shapes.load("dgx-h100")
    hw = mighw.MigHardware()
    player = kubeletdp.DevicePluginCapacity(grace_period=30.0, clock=lambda: now[0], mig=hw)
    client = FakeClient()

    def plugin(strategy: str, uid: str) -> PodView:
        return PodView(
            "gpu-operator",
            f"dp-{uid}",
            uid,
            kubeletdp.APP,
            "dgx-h100-0",
            True,
            0,
            None,
            {"MIG_STRATEGY": strategy},
        )

    def last() -> dict[str, dict[str, str]]:
        status: dict[str, dict[str, str]] = client.calls[-1][1][1]["status"]
        return status

    async def go() -> None:
        await player.sync(client, "dgx-h100-0", view(), [plugin("mixed", "a")])  # type: ignore[arg-type]
        assert last() == {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}
        hw.set("dgx-h100-0", shape, applied("all-1g.10gb"))
        await player.sync(client, "dgx-h100-0", view(), [plugin("mixed", "b")])  # type: ignore[arg-type]
        assert last() == {
            "capacity": {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "56"},
            "allocatable": {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"},
        }
        now[0] = 31.0
        await player.sync(client, "dgx-h100-0", view(), [plugin("mixed", "b")])  # type: ignore[arg-type]
        assert last()["capacity"] == {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}
        hw.set("dgx-h100-0", shape, applied("all-balanced"))  # single refuses it: the plugin exits
        await player.sync(client, "dgx-h100-0", view(), [plugin("single", "c")])  # type: ignore[arg-type]
        assert last()["allocatable"] == {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "0"}

    asyncio.run(go())


def test_the_mig_manager_stops_with_its_pod_when_its_successor_already_runs() -> None:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node

    player = migmanager.MigManager(mighw.MigHardware())
    started: list[str] = []
    cancelled: list[str] = []

    async def reconfigure(client: object, node: str, shape: object, pod: PodView, value: str) -> None:
        started.append(pod.uid)
        try:
            await asyncio.Event().wait()  # waiting for the GPU clients to go
        except asyncio.CancelledError:
            cancelled.append(pod.uid)
            raise

    player.reconfigure = reconfigure  # type: ignore[method-assign]

    class Nodes:
        async def get(self, resource: object, name: str) -> Node:
            return Node(metadata=ObjectMeta(name=name, labels={"nvidia.com/mig.config": "all-1g.10gb"}))

    def pod(uid: str, started_at: int) -> PodView:
        return PodView(
            "gpu-operator", f"mig-manager-{uid}", uid, migmanager.APP, "dgx-h100-0", True, started_at
        )

    async def go() -> None:
        await player.sync(Nodes(), "dgx-h100-0", view(), [pod("a", 1)])  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert started == ["a"] and cancelled == []
        # pod a deleted and its successor b Running, seen in one sync (the work queue coalesced them)
        await player.sync(Nodes(), "dgx-h100-0", view(), [pod("b", 2)])  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert cancelled == ["a"] and started == ["a", "b"]
        await player.sync(Nodes(), "dgx-h100-0", view(), [])  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert cancelled == ["a", "b"] and not player.running

    asyncio.run(go())
