"""GPU feature discovery's labels mirrored onto the Node (controllers/units/labels/gfdlabels.py), through the
node-labelling decision that carries them (nodelabels.desired_change)."""

from __future__ import annotations

import re

import pytest

from gpu_operator.controllers.units.labels.gfdlabels import gfd_change, mirrored, written
from gpu_operator.controllers.units.labels.labeller import _describe
from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy, desired_change
from gpu_operator.controllers.views import NodeView
from gpu_operator.controllers.watches import gfd_node_of
from gpu_operator.render.states.mig_manager import LAYOUTS, mig_capable_devices
from gpu_operator.vocabulary import GFD_LABELS_ANNOTATION, MIG_CONFIG, MIG_MANAGER, deploy_label

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
GFD = deploy_label("gpu-feature-discovery")
MIRROR = LabelPolicy(gfd_mirror=True)
H100_GFD = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/gfd.timestamp": "1764230000",
    "nvidia.com/cuda.driver-version.full": "580.95.05",
}
A10_GFD = {
    "nvidia.com/gpu.product": "NVIDIA-A10",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/mig.capable": "false",
}


def settled(
    labels: dict[str, str], annotations: dict[str, str], policy: LabelPolicy, gfd: dict[str, str] | None
) -> tuple[dict[str, str], dict[str, str]]:
    """Apply desired_change until nothing changes (as the label loop's echoes do)."""
    for _ in range(5):
        change = desired_change(labels, annotations, policy, gfd=gfd)
        if not change:
            return labels, annotations
        for target, delta in ((labels, change.labels), (annotations, change.annotations)):
            for key, value in delta.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
    raise AssertionError("labels did not settle")


def test_a_default_install_h100_node_gets_gfd_labels_and_the_mig_manager_in_one_patch() -> None:
    labels = {**GPU, GFD: "true", "nvidia.com/gpu.present": "true"}
    change = desired_change(labels, {}, MIRROR, gfd=H100_GFD)
    assert {k: change.labels[k] for k in H100_GFD} == H100_GFD
    assert change.labels[MIG_MANAGER] == "true" and change.labels[MIG_CONFIG] == "all-disabled"
    assert written(change.annotations) == set(H100_GFD)  # type: ignore[arg-type]


def test_an_a10_node_gets_gfd_labels_and_no_mig_manager() -> None:
    labels, _ = settled(
        {**GPU, "feature.node.kubernetes.io/pci-10de_2236.present": "true"}, {}, MIRROR, A10_GFD
    )
    assert (
        labels["nvidia.com/mig.capable"] == "false" and MIG_MANAGER not in labels and MIG_CONFIG not in labels
    )


def test_nothing_changes_when_gfd_publishes_the_same_labels_again() -> None:
    labels, annotations = settled(dict(GPU), {}, MIRROR, H100_GFD)
    assert not desired_change(labels, annotations, MIRROR, gfd=dict(H100_GFD))


def test_a_changed_value_is_one_patch_of_that_label() -> None:
    labels, annotations = settled(dict(GPU), {}, MIRROR, H100_GFD)
    change = desired_change(
        labels, annotations, MIRROR, gfd={**H100_GFD, "nvidia.com/gfd.timestamp": "1764239999"}
    )
    assert change.labels == {"nvidia.com/gfd.timestamp": "1764239999"} and not change.annotations


def test_when_the_nodefeature_goes_exactly_the_mirrored_labels_go() -> None:
    labels, annotations = settled(dict(GPU), {}, MIRROR, H100_GFD)
    labels["nvidia.com/gpu.custom"] = "set-by-a-person"
    change = desired_change(labels, annotations, MIRROR, gfd=None)
    assert {k for k, v in change.labels.items() if v is None} == set(H100_GFD)
    assert change.annotations == {GFD_LABELS_ANNOTATION: None}
    # the MIG manager stays on a container node once set (as before); the node keeps the rest
    assert MIG_MANAGER not in change.labels


def test_gfd_disabled_in_the_policy_removes_what_was_mirrored() -> None:
    labels, annotations = settled(dict(GPU), {}, MIRROR, H100_GFD)
    off = LabelPolicy(gfd_mirror=True, gfd_enabled=False)
    change = desired_change(labels, annotations, off, gfd=H100_GFD)  # the object outlives GFD a moment
    assert {k for k, v in change.labels.items() if v is None} >= set(H100_GFD)


@pytest.mark.parametrize("value", ["false", None])
def test_a_node_gfd_no_longer_runs_on_loses_the_labels(value: str | None) -> None:
    labels, annotations = settled(dict(GPU), {}, MIRROR, H100_GFD)
    labels[deploy_label("operands")] = "false"  # the user takes the node out of every operand
    change = desired_change(labels, annotations, MIRROR, gfd=H100_GFD)
    assert all(change.labels.get(k, "kept") is None for k in H100_GFD)


def test_labels_stay_while_the_mig_manager_pauses_gfd() -> None:
    labels, annotations = settled(dict(GPU), {}, MIRROR, H100_GFD)
    labels[GFD] = "paused-for-mig-change"
    assert not any(k in desired_change(labels, annotations, MIRROR, gfd=H100_GFD).labels for k in H100_GFD)


def test_with_nfd_in_charge_the_operator_writes_and_removes_none_of_them() -> None:
    nfd = LabelPolicy(gfd_mirror=False)
    labels = {**GPU, **H100_GFD}  # NFD's master put them there
    change = desired_change(labels, {GFD_LABELS_ANNOTATION: "gpu.product"}, nfd, gfd=None)
    assert not set(change.labels) & set(H100_GFD) and GFD_LABELS_ANNOTATION not in change.annotations
    assert not set(desired_change(dict(GPU), {}, nfd, gfd=H100_GFD).labels) & set(H100_GFD)


def test_a_label_someone_else_set_to_the_same_value_stays_theirs() -> None:
    change = gfd_change({"nvidia.com/gpu.product": "NVIDIA-A10"}, {}, A10_GFD)
    assert "nvidia.com/gpu.product" not in change.labels
    assert "gpu.product" not in (change.annotations[GFD_LABELS_ANNOTATION] or "").split(",")
    notes = {k: v for k, v in change.annotations.items() if v is not None}
    assert not gfd_change({"nvidia.com/gpu.product": "NVIDIA-A10"}, notes, None).labels


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("nvidia.com/gpu.product", "NVIDIA-H100", True),
        ("feature.node.kubernetes.io/pci-10de.present", "true", False),  # not GFD's prefix
        ("nvidia.com/gpu.deploy.driver", "false", False),  # the operator's
        ("nvidia.com/gpu.present", "true", False),
        ("nvidia.com/mig.config", "all-1g.10gb", False),  # the user's / MIG manager's
        ("nvidia.com/gpu.product", "x" * 64, False),  # a value Kubernetes refuses
        ("nvidia.com/gpu.product", "bad value", False),
    ],
)
def test_what_may_be_mirrored(key: str, value: str, ok: bool) -> None:
    assert mirrored(key, value) is ok


@pytest.mark.parametrize(
    ("name", "labels", "node"),
    [
        ("nvidia-features-for-n1", {"nfd.node.kubernetes.io/node-name": "n1"}, "n1"),
        ("nvidia-features-for-n1", {}, None),
        ("other-vendor-features-for-n1", {"nfd.node.kubernetes.io/node-name": "n1"}, None),
        ("nvidia-features-for-n2", {"nfd.node.kubernetes.io/node-name": "n1"}, None),
    ],
)
def test_only_gfds_own_objects_count(name: str, labels: dict[str, str], node: str | None) -> None:
    assert gfd_node_of(name, labels) == node


def test_mig_layout_device_filters_are_pci_ids() -> None:
    """mig-parted reads each filter as 0x<device><vendor>; a malformed one never matches a GPU."""
    for line in LAYOUTS.read_text().splitlines():
        if line.strip() and not line.startswith("#") and line.split()[1] != "*":
            for device in line.split()[1].split(","):
                assert re.fullmatch(r"0x[0-9A-F]{4}10DE", device), line
    assert {"20b7", "2330", "2335", "2901", "2941"} <= mig_capable_devices()


def test_the_node_view_keeps_what_the_mirror_reads() -> None:
    """The operator's node views drop annotations nobody reads; the mirror reads its own list."""
    view = NodeView.of_parts(
        "n1",
        {**GPU, "nvidia.com/gpu.product": "NVIDIA-A10"},
        {GFD_LABELS_ANNOTATION: "gpu.product", "other.example/x": "y"},
    )
    assert view.annotations == {GFD_LABELS_ANNOTATION: "gpu.product"}
    assert desired_change(view.labels, view.annotations, MIRROR, gfd=None).labels == {
        "nvidia.com/gpu.product": None,
        **desired_change(view.labels, {}, MIRROR, gfd=None).labels,
    }


def test_the_log_line_counts_gfds_labels_and_names_the_few_that_say_what_the_node_is() -> None:
    labels = {**GPU, GFD: "true", "nvidia.com/gpu.present": "true"}
    change = desired_change(labels, {}, MIRROR, gfd=H100_GFD)
    line = _describe(change.labels, change.annotations)
    assert line.split(", GPU feature discovery's labels: ")[1] == (
        "5 set (nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.count=8, nvidia.com/mig.capable=true)"
    )
    assert "nvidia.com/gpu.deploy.mig-manager=true" in line.split(", ")
    settled_labels, notes = settled(dict(labels), {}, MIRROR, H100_GFD)
    gone = desired_change(settled_labels, notes, MIRROR, gfd=None)
    assert _describe(gone.labels, gone.annotations).endswith(
        "GPU feature discovery's labels: 0 set, 5 removed"
    )
