"""Node labelling writes each GPU node's container-toolkit group where it is not stock containerd
(the toolkit DaemonSets select on it: render/states/container_toolkit.py)."""

from __future__ import annotations

from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy, desired_change
from gpu_operator.controllers.views import is_relevant_label
from gpu_operator.render.distributions import PENDING
from gpu_operator.vocabulary import GPU_PRESENT, RUNTIME_GROUP

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}


def test_a_k3s_gpu_node_is_labelled_with_the_patch_that_places_the_toolkit() -> None:
    change = desired_change(dict(GPU), {}, LabelPolicy(), runtime_group="k3s")
    assert change.labels[RUNTIME_GROUP] == "k3s"
    assert change.labels[GPU_PRESENT] == "true"


def test_stock_containerd_carries_no_label_and_a_stale_one_goes() -> None:
    assert (
        RUNTIME_GROUP not in desired_change(dict(GPU), {}, LabelPolicy(), runtime_group="containerd").labels
    )
    labelled = {**GPU, RUNTIME_GROUP: "k3s"}
    assert (
        desired_change(labelled, {}, LabelPolicy(), runtime_group="containerd").labels[RUNTIME_GROUP] is None
    )


def test_no_label_without_a_gpu_and_none_rewritten() -> None:
    assert RUNTIME_GROUP not in desired_change({}, {}, LabelPolicy(), runtime_group="k3s").labels
    settled = desired_change(dict(GPU), {}, LabelPolicy(), runtime_group="rke2-v3").labels
    node = {**GPU, **{k: v for k, v in settled.items() if v is not None}}
    assert not desired_change(node, {}, LabelPolicy(), runtime_group="rke2-v3")


def test_microk8s_label_is_kept_in_memory() -> None:
    assert is_relevant_label("microk8s.io/cluster")


def test_a_runtime_not_reported_yet_leaves_the_label_as_it_is() -> None:
    """nodeInfo.containerRuntimeVersion still empty: nothing is decided (no label written, none removed)."""
    assert RUNTIME_GROUP not in desired_change(dict(GPU), {}, LabelPolicy(), runtime_group=PENDING).labels
    labelled = {**GPU, RUNTIME_GROUP: "k3s"}
    assert RUNTIME_GROUP not in desired_change(labelled, {}, LabelPolicy(), runtime_group=PENDING).labels
