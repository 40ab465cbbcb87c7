"""The GPU systems of the shapes dgx-a100, dgx-b200 and gb200-nvl72: each model's MIG profiles as
NVIDIA's MIG user guide lists them, the rendered default layouts applied (or refused) per model
through mig-parted's rules, GFD's labels (product, family, the NVLink clique), the arm64 node."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_operator import shapes
from gpu_operator.render.states.mig_manager import default_mig_config, mig_capable_devices
from gpu_operator.sim.hardware import mighw, migparted, migprofiles
from gpu_operator.sim.standins import migresources

# NVIDIA's MIG user guide, "Supported MIG Profiles": profile -> instances that fit one GPU
GUIDE = {
    "20b0": {
        "1g.5gb": 7,
        "1g.5gb+me": 1,
        "1g.10gb": 4,
        "2g.10gb": 3,
        "3g.20gb": 2,
        "4g.20gb": 1,
        "7g.40gb": 1,
    },
    "20b2": {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
    "2330": {
        "1g.10gb": 7,
        "1g.10gb+me": 1,
        "1g.20gb": 4,
        "2g.20gb": 3,
        "3g.40gb": 2,
        "4g.40gb": 1,
        "7g.80gb": 1,
    },
    "2901": {
        "1g.23gb": 7,
        "1g.23gb+me": 1,
        "1g.45gb": 4,
        "2g.45gb": 3,
        "3g.90gb": 2,
        "4g.90gb": 1,
        "7g.180gb": 1,
    },
    "2941": {
        "1g.23gb": 7,
        "1g.23gb+me": 1,
        "1g.47gb": 4,
        "2g.47gb": 3,
        "3g.93gb": 2,
        "4g.93gb": 1,
        "7g.186gb": 1,
    },
}


def applied(shape: str, layout: str) -> list[migparted.GpuMig]:
    entries = migparted.select(migparted.parse(default_mig_config()), layout)
    return migparted.apply(entries, mighw.shape_gpus(shapes.load(shape)))


@pytest.mark.parametrize("device", sorted(GUIDE))
def test_each_models_profiles_are_the_guides(device: str) -> None:
    model = migprofiles.model(f"0x{device.upper()}10DE")
    assert model is not None
    assert {p.name: p.max_count for p in model.profiles} == GUIDE[device]
    for name, count in GUIDE[device].items():  # each profile alone, as many as fit, is placed
        assert len(migprofiles.place(model, {name: count})) == count


@pytest.mark.parametrize("shape", ["dgx-a100", "dgx-b200", "gb200-nvl72"])
def test_the_shapes_gpus_are_mig_capable_in_the_operators_table(shape: str) -> None:
    found = shapes.load(shape)
    device = found.gpu_vendor_device.partition(":")[2]
    assert found.mig_capable and device in mig_capable_devices()
    assert migprofiles.model(device) is not None


@pytest.mark.parametrize(
    ("layout", "ok_on", "refused_on"),
    [
        ("all-1g.5gb", "dgx-a100", "dgx-h100"),  # an A100 40GB profile the H100 has not
        ("all-1g.10gb", "dgx-h100", None),  # the rendered config gives the A100 40GB 1g.10gb=4 instead
        ("all-1g.45gb", "dgx-b200", "gb200-nvl72"),  # the B200's 180 GB split; the GB200's is 1g.47gb
        ("all-7g.186gb", "gb200-nvl72", "dgx-b200"),
        ("all-3g.40gb", "dgx-h100", "dgx-b200"),
    ],
)
def test_a_layout_valid_on_one_model_is_refused_on_another(
    layout: str, ok_on: str, refused_on: str | None
) -> None:
    done = applied(ok_on, layout)
    assert all(g.enabled and g.instances for g in done)
    if refused_on is not None:
        with pytest.raises(migprofiles.LayoutError, match="does not exist on"):
            applied(refused_on, layout)


def test_the_a100_gets_the_filtered_lines_of_its_device() -> None:
    assert [g.layout() for g in applied("dgx-a100", "all-1g.10gb")] == [(True, {"1g.10gb": 4})] * 8
    assert [g.layout() for g in applied("dgx-a100", "all-balanced")] == [
        (True, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})
    ] * 8
    assert [g.layout() for g in applied("dgx-b200", "all-balanced")] == [
        (True, {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1})
    ] * 8
    assert [g.layout() for g in applied("gb200-nvl72", "all-balanced")] == [
        (True, {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1})
    ] * 4


def test_gfd_mig_labels_of_a_b200() -> None:
    shape = shapes.load("dgx-b200")
    labels = migresources.gfd_labels(shape, "single", applied("dgx-b200", "all-3g.90gb"))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-B200-MIG-3g.90gb"
    assert labels["nvidia.com/gpu.count"] == "16" and labels["nvidia.com/gpu.memory"] == "92160"
    assert labels["nvidia.com/gpu.multiprocessors"] == "54"


@pytest.mark.parametrize(
    ("shape", "product", "family", "count", "arch"),
    [
        ("dgx-a100", "NVIDIA-A100-SXM4-40GB", "ampere", "8", "amd64"),
        ("dgx-b200", "NVIDIA-B200", "blackwell", "8", "amd64"),
        ("gb200-nvl72", "NVIDIA-GB200", "blackwell", "4", "arm64"),
    ],
)
def test_settled_nodes(shape: str, product: str, family: str, count: str, arch: str) -> None:
    node = shapes.nodes([f"{shape}:1"], settled=True)[0]
    labels = node["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.family"]) == (product, family)
    assert labels["nvidia.com/gpu.count"] == count and node["status"]["capacity"]["nvidia.com/gpu"] == count
    assert labels["kubernetes.io/arch"] == arch and node["status"]["nodeInfo"]["architecture"] == arch
    assert labels["nvidia.com/mig.capable"] == "true"
    assert (shapes.GPU_CLIQUE in labels) == (shape == "gb200-nvl72")


def test_the_nvl72_clique_follows_the_fabric() -> None:
    """GFD's gpu.clique is `<cluster UUID>.<clique ID>` of the node's fabric (imex.go): the same on
    the 18 trays of one rack, another cluster UUID on the next rack, another clique ID where the
    domain is partitioned; no clique where the node has no NVLink fabric, and not on the Node
    before GFD ran."""
    nodes = shapes.nodes(["gb200-nvl72:20"], settled=True)
    cliques = [n["metadata"]["labels"][shapes.GPU_CLIQUE] for n in nodes]
    assert len(set(cliques[:18])) == 1 and cliques[18] == cliques[19] != cliques[0]
    uuid, _, clique = cliques[0].partition(".")
    assert len(uuid) == 36 and clique == "1" and cliques[18].partition(".")[2] == "1"
    assert shapes.GPU_CLIQUE not in shapes.nodes(["gb200-nvl72:1"])[0]["metadata"]["labels"]
    split = dataclasses.replace(shapes.load("gb200-nvl72"), nvlink_clique_nodes=2)
    ids = [split.fabric_ids(f"gb200-nvl72-{i}") for i in range(4)]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]
    assert ids[0] is not None and ids[2] is not None and ids[0][0] == ids[2][0]
    assert (ids[0][1], ids[2][1]) == ("1", "2")
    assert shapes.GPU_CLIQUE not in shapes.load("dgx-b200").gfd_labels(node="dgx-b200-0")


def _daemonsets(shape: shapes.Shape) -> dict[str, dict]:  # type: ignore[type-arg]
    from pathlib import Path

    from gpu_operator.render import render
    from gpu_operator.render.clitext import label_gpu_nodes, load_policy
    from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
    from gpu_operator.render.facts import ClusterFacts

    nodes = [shape.settled_node(f"{shape.name}-0")]
    label_gpu_nodes(nodes)
    facts = ClusterFacts.from_nodes(
        nodes, namespace="gpu-operator", k8s_version="1.36.0", operator_env=dict(CHART_DEFAULT_IMAGES)
    )
    policy = load_policy(Path(__file__).parents[3] / "examples/clusterpolicy-default.yaml")
    return {o["metadata"]["name"]: o for o in render(policy, facts).objects() if o["kind"] == "DaemonSet"}


def test_arm64_nodes_get_the_same_multi_arch_references_and_no_arch_pin() -> None:
    """The operands' images are multi-arch indexes (NVIDIA's on nvcr.io, ours from `./dev image
    --arch all`): the render names one reference per operand and the node's runtime pulls its
    platform's image, so the GB200 node's DaemonSets carry the references the same host on amd64
    would get, and nothing that keeps them off kubernetes.io/arch=arm64."""
    gb200 = shapes.load("gb200-nvl72")
    assert gb200.node("gb200-nvl72-0")["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"
    arm, amd = _daemonsets(gb200), _daemonsets(dataclasses.replace(gb200, arch="amd64"))
    assert arm and set(arm) == set(amd)

    def images(ds: dict) -> list[str]:  # type: ignore[type-arg]
        spec = ds["spec"]["template"]["spec"]
        return [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]

    for name, ds in arm.items():
        assert images(ds) == images(amd[name]), name
        assert "kubernetes.io/arch" not in str(ds["spec"]["template"]["spec"].get("nodeSelector", {})), name
        assert "kubernetes.io/arch" not in str(ds["spec"]["template"]["spec"].get("affinity", {})), name


def test_dra_mig_device_names_carry_the_profile_id_of_its_kind() -> None:
    """NVIDIA's DRA driver names a static MIG device gpu-<minor>-mig-<profile>-<GI profile ID>-<start>;
    the ID goes with the profile's kind, so the A100 40GB's 1g.10gb (two memory slices) is 15
    where the H100's 1g.10gb (one) is 19."""
    from gpu_operator.sim.standins import dramig

    a100 = applied("dgx-a100", "all-1g.10gb")[0].instances[0]
    h100 = applied("dgx-h100", "all-1g.10gb")[0].instances[0]
    b200 = applied("dgx-b200", "all-balanced")[0].instances
    assert dramig.device_name(0, a100) == f"gpu-0-mig-1g10gb-15-{a100.start}"
    assert dramig.device_name(0, h100) == f"gpu-0-mig-1g10gb-19-{h100.start}"
    assert sorted(dramig.device_name(1, i) for i in b200) == [
        "gpu-1-mig-1g23gb-19-3",
        "gpu-1-mig-1g23gb-19-6",
        "gpu-1-mig-2g45gb-14-4",
        "gpu-1-mig-3g90gb-9-0",
    ]
