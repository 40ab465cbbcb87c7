"""The RTX PRO 6000 Blackwell Server Edition (shape rtx-pro-6000): a MIG model of 4 compute slots
whose profiles carry NVML's attribute suffixes (+gfx, +me, +me.all, -me), played end to end: the
rendered default layouts applied through mig-parted's rules, the GPU instance IDs, the device
plugin's resources and GFD's labels per MIG strategy, the DRA driver's device names."""

from __future__ import annotations

import pytest

from gpu_operator import shapes
from gpu_operator.render.states.mig_manager import default_mig_config, mig_capable_devices
from gpu_operator.sim.hardware import mighw, migparted, migprofiles
from gpu_operator.sim.standins import dramig, migresources

SHAPE = "rtx-pro-6000"
# NVIDIA/mig-parted pkg/mig/builder/builder_test.go, gpuProfiles["RTX-PRO-6000"]: profile -> how many fit
PROFILES = {
    "1g.24gb": 4,
    "1g.24gb+me": 1,
    "1g.24gb+gfx": 4,
    "1g.24gb+me.all": 1,
    "1g.24gb-me": 4,
    "2g.48gb": 2,
    "2g.48gb+gfx": 2,
    "2g.48gb+me.all": 1,
    "2g.48gb-me": 2,
    "4g.96gb": 1,
    "4g.96gb+gfx": 1,
}
# the same test's configs for that GPU: name -> the layout each GPU gets
CONFIGS = {
    "all-1g.24gb": {"1g.24gb": 4},
    "all-1g.24gb.me": {"1g.24gb+me": 1},
    "all-1g.24gb.gfx": {"1g.24gb+gfx": 4},
    "all-1g.24gb.me.all": {"1g.24gb+me.all": 1},
    "all-1g.24gb-me": {"1g.24gb-me": 4},
    "all-2g.48gb": {"2g.48gb": 2},
    "all-2g.48gb.gfx": {"2g.48gb+gfx": 2},
    "all-2g.48gb.me.all": {"2g.48gb+me.all": 1},
    "all-2g.48gb-me": {"2g.48gb-me": 2},
    "all-4g.96gb": {"4g.96gb": 1},
    "all-4g.96gb.gfx": {"4g.96gb+gfx": 1},
    "all-balanced": {"1g.24gb": 2, "2g.48gb": 1},
}
MODEL = migprofiles.model("0x2BB510DE")


def applied(shape: str, layout: str) -> list[migparted.GpuMig]:
    entries = migparted.select(migparted.parse(default_mig_config()), layout)
    return migparted.apply(entries, mighw.shape_gpus(shapes.load(shape)))


def test_the_model_is_mig_parteds_and_the_shapes() -> None:
    assert MODEL is not None and MODEL.compute_slots == 4
    assert {p.name: p.max_count for p in MODEL.profiles} == PROFILES
    for name, count in PROFILES.items():  # each alone, as many as fit
        assert len(migprofiles.place(MODEL, {name: count})) == count
    shape = shapes.load(SHAPE)
    device = shape.gpu_vendor_device.partition(":")[2]
    assert shape.mig_capable and device in mig_capable_devices() and migprofiles.model(device) is MODEL


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_config_nvidia_builds_for_it_is_in_the_rendered_file_and_fits(config: str) -> None:
    done = applied(SHAPE, config)
    assert [g.layout() for g in done] == [(True, CONFIGS[config])] * 8


@pytest.mark.parametrize(
    ("layout", "placed"),
    [
        (
            "all-1g.24gb.gfx",
            [("1g.24gb+gfx", 0, 3), ("1g.24gb+gfx", 1, 4), ("1g.24gb+gfx", 2, 5), ("1g.24gb+gfx", 3, 6)],
        ),
        (
            "all-1g.24gb-me",
            [("1g.24gb-me", 0, 3), ("1g.24gb-me", 1, 4), ("1g.24gb-me", 2, 5), ("1g.24gb-me", 3, 6)],
        ),
        # nvidia-smi on an RTX PRO 6000: 2g.48gb at the first half is GPU instance 1, 1g.24gb at 2, 3: 5, 6
        ("all-balanced", [("2g.48gb", 0, 1), ("1g.24gb", 2, 5), ("1g.24gb", 3, 6)]),
        ("all-4g.96gb.gfx", [("4g.96gb+gfx", 0, 0)]),
        ("all-2g.48gb-me", [("2g.48gb-me", 0, 1), ("2g.48gb-me", 2, 2)]),
    ],
)
def test_placements_and_gpu_instance_ids(layout: str, placed: list[tuple[str, int, int]]) -> None:
    for gpu in applied(SHAPE, layout):
        assert [(i.profile.name, i.start, i.gi) for i in gpu.instances] == placed
        assert migparted.from_json(migparted.to_json([gpu])) == [gpu]  # the saved state keeps the IDs


def test_the_seven_slot_ids_are_unchanged() -> None:
    h100 = migprofiles.model("2330")
    assert h100 is not None
    placed = migprofiles.place(h100, {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    assert [(p.name, s, migprofiles.gi_id(p, s)) for p, s in placed] == [
        ("3g.40gb", 0, 1),
        ("2g.20gb", 4, 5),
        ("1g.10gb", 3, 10),
        ("1g.10gb", 6, 13),
    ]
    assert migprofiles.gi_id(h100.profiles[-1], 0) == 0  # 7g.80gb
    with pytest.raises(ValueError, match="no GPU instance IDs known"):
        migprofiles.gi_id(h100.profiles[0], 0, compute_slots=8)


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        (
            {"1g.24gb+me.all": 2},
            r"2 x 1g\.24gb\+me\.all on NVIDIA RTX PRO 6000 Blackwell Server Edition: at most 1 fit",
        ),
        ({"1g.24gb+me": 2}, "at most 1 fit"),
        # one media extension per GPU: +me and +me.all both need the one OFA
        ({"1g.24gb+me": 1, "2g.48gb+me.all": 1}, r"needs 5 NVDEC, 5 NVENC, 5 JPEG, 2 OFA; .* share 4 NVDEC"),
        ({"1g.24gb+me": 1, "1g.24gb+me.all": 1}, "2 OFA"),
        # +me.all takes every media engine: a 1g.24gb beside it has none left
        ({"1g.24gb+me.all": 1, "1g.24gb": 1}, "needs 5 NVDEC"),
        (
            {"1g.24gb": 4, "2g.48gb": 1},
            "needs 6 memory slices; NVIDIA RTX PRO 6000 Blackwell Server Edition has 4",
        ),
        ({"2g.48gb": 1, "1g.24gb+gfx": 3}, "needs 5 memory slices"),
    ],
)
def test_layouts_the_driver_refuses(wanted: dict[str, int], message: str) -> None:
    assert MODEL is not None
    with pytest.raises(migprofiles.LayoutError, match=message):
        migprofiles.place(MODEL, wanted)


def test_what_fits_beside_the_media_extensions() -> None:
    assert MODEL is not None
    assert len(migprofiles.place(MODEL, {"1g.24gb+me.all": 1, "1g.24gb-me": 3})) == 4
    assert len(migprofiles.place(MODEL, {"2g.48gb+me.all": 1, "2g.48gb-me": 1})) == 2
    assert len(migprofiles.place(MODEL, {"1g.24gb+me": 1, "1g.24gb+gfx": 3})) == 4


@pytest.mark.parametrize(
    ("layout", "ok_on", "refused_on"),
    [
        # H100 layouts for every GPU (`*`; all-1g.10gb's lines name their devices, so an RTX PRO 6000
        # is left as it is, as mig-parted leaves a GPU no entry matches)
        ("all-1g.10gb.me", "dgx-h100", SHAPE),
        ("all-3g.40gb", "dgx-h100", SHAPE),
        ("all-1g.24gb.gfx", SHAPE, "dgx-h100"),  # +gfx profiles exist on the RTX PRO 6000 only
        ("all-4g.96gb", SHAPE, "dgx-b200"),
    ],
)
def test_a_layout_of_one_model_is_refused_on_the_other(layout: str, ok_on: str, refused_on: str) -> None:
    assert all(g.enabled and g.instances for g in applied(ok_on, layout))
    with pytest.raises(migprofiles.LayoutError, match="does not exist on"):
        applied(refused_on, layout)


def test_a_layout_with_no_line_for_it_leaves_the_gpus_as_they_are() -> None:
    assert [g.layout() for g in applied(SHAPE, "all-1g.10gb")] == [(False, {})] * 8


def test_device_plugin_resources_per_strategy() -> None:
    gfx, no_media = applied(SHAPE, "all-1g.24gb.gfx"), applied(SHAPE, "all-1g.24gb-me")
    assert migresources.counts("mixed", gfx) == {"nvidia.com/mig-1g.24gb.gfx": 32}
    assert migresources.counts("mixed", no_media) == {"nvidia.com/mig-1g.24gb-me": 32}
    assert migresources.counts("mixed", applied(SHAPE, "all-balanced")) == {
        "nvidia.com/mig-1g.24gb": 16,
        "nvidia.com/mig-2g.48gb": 8,
    }
    assert migresources.counts("mixed", applied(SHAPE, "all-1g.24gb.me.all")) == {
        "nvidia.com/mig-1g.24gb.me.all": 8
    }
    assert migresources.counts("single", gfx) == {"nvidia.com/gpu": 32}
    assert migresources.counts("none", gfx) == {"nvidia.com/gpu": 8}
    with pytest.raises(migresources.PluginError, match="more than one MIG device type"):
        migresources.counts("single", applied(SHAPE, "all-balanced"))


def test_gfd_mig_labels() -> None:
    shape = shapes.load(SHAPE)
    single = migresources.gfd_labels(shape, "single", applied(SHAPE, "all-1g.24gb.gfx"))
    assert single["nvidia.com/gpu.product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb.gfx"
    assert (
        single["nvidia.com/gpu.count"],
        single["nvidia.com/gpu.memory"],
        single["nvidia.com/gpu.replicas"],
    ) == ("32", "24192", "1")
    assert (
        single["nvidia.com/gpu.multiprocessors"],
        single["nvidia.com/gpu.slices.gi"],
        single["nvidia.com/gpu.engines.decoder"],
        single["nvidia.com/gpu.engines.ofa"],
    ) == ("46", "1", "1", "0")
    assert single["nvidia.com/mig.strategy"] == "single" and single["nvidia.com/gpu.family"] == "blackwell"
    mixed = migresources.gfd_labels(shape, "mixed", applied(SHAPE, "all-1g.24gb-me"))
    assert mixed["nvidia.com/mig-1g.24gb-me.count"] == "32"
    assert (
        mixed["nvidia.com/mig-1g.24gb-me.product"]
        == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb-me"
    )
    assert mixed["nvidia.com/mig-1g.24gb-me.engines.decoder"] == "0"
    assert mixed["nvidia.com/gpu.replicas"] == "0"  # every GPU has MIG on


def test_settled_node() -> None:
    node = shapes.nodes([f"{SHAPE}:1"], settled=True)[0]
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    assert (
        labels["nvidia.com/gpu.family"],
        labels["nvidia.com/gpu.compute.major"],
        labels["nvidia.com/gpu.compute.minor"],
    ) == ("blackwell", "12", "0")
    assert (
        labels["nvidia.com/mig.capable"] == "true"
        and labels["feature.node.kubernetes.io/pci-10de_2bb5.present"]
    )
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8" and labels["kubernetes.io/arch"] == "amd64"
    assert shapes.GPU_CLIQUE not in labels  # PCIe cards: no NVLink fabric


def test_dra_device_names_carry_the_models_profile_ids() -> None:
    """NVIDIA's DRA driver names a MIG device gpu-<minor>-mig-<profile, `+` as `-`>-<GI profile
    ID>-<start>; the RTX PRO 6000's IDs are its own (1g.24gb+gfx 47, 2g.48gb 5), not the 7-slot
    models' by kind (1g 19, 2g 14)."""
    gfx = applied(SHAPE, "all-1g.24gb.gfx")[0].instances[0]
    assert dramig.device_name(0, gfx) == "gpu-0-mig-1g24gb-gfx-47-0"
    balanced = applied(SHAPE, "all-balanced")[1].instances
    assert sorted(dramig.device_name(1, i) for i in balanced) == [
        "gpu-1-mig-1g24gb-14-2",
        "gpu-1-mig-1g24gb-14-3",
        "gpu-1-mig-2g48gb-5-0",
    ]
    assert dramig.capacity_values(gfx.profile)["memory"] == 24192 * 1024 * 1024
