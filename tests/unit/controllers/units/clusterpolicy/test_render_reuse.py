"""A ClusterPolicy pass whose inputs equal the last one's reuses its render (controllers/units/
clusterpolicy/reconcile.py, `LastRender`), and the applier reuses what it stamped of the same result
(controllers/apply.py, `Applier._stamp`): the renderer is pure, so equal inputs give equal objects.
Each input the renderer reads (the policy's name and spec, every node's facts, the cluster's facts)
renders again when it changes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpu_operator.controllers.apply import Applier, owner_reference
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.clusterpolicy.reconcile import ClusterPolicyReconciler
from gpu_operator.controllers.views import ClusterPolicyView, NodeView
from gpu_operator.render import readlabels, render
from gpu_operator.render.facts import ClusterFacts, NodeFacts
from gpu_operator.vocabulary import HASH_ANNOTATION
from tests.unit.render.renderkit import IMAGES, facts, policy


def reconciler() -> ClusterPolicyReconciler:
    return ClusterPolicyReconciler(object(), OperatorSettings(), IMAGES)  # type: ignore[arg-type]


def test_equal_inputs_render_once_and_give_the_same_result() -> None:
    r = reconciler()
    first, problems = r._render(policy(), facts("dgx-h100:3"))
    again, problems_again = r._render(policy(), facts("dgx-h100:3"))  # equal, not the same objects
    assert r.renders == 1
    assert again is first and problems_again is problems
    assert [o for s in again.states for o in s.objects] == [
        o for s in render(policy(), facts("dgx-h100:3")).states for o in s.objects
    ]


def relabelled(node: NodeFacts, key: str, value: str) -> NodeFacts:
    assert isinstance(node.labels, readlabels.ReadLabels)
    # the raw dict: walking the labels would note it
    return dataclasses.replace(node, labels={**node.labels.raw, key: value})


@pytest.mark.parametrize("change", ["spec", "name", "node label", "node added", "runtime", "cluster"])
def test_a_change_of_any_input_renders_again(change: str) -> None:
    readlabels.forget()
    r = reconciler()
    base_facts = facts("dgx-h100:3")
    r._render(policy(), base_facts)
    p, f = policy(), base_facts
    if change == "spec":
        p = policy({"dcgmExporter": {"enabled": False}})
    elif change == "name":
        p = policy()
        p.metadata.name = "other"
    elif change == "node label":  # one the renderer reads: a GPU node becomes a VM guest
        moved = relabelled(f.nodes[0], "feature.node.kubernetes.io/cpu-cpuid.HYPERVISOR", "true")
        f = dataclasses.replace(f, nodes=(moved, *f.nodes[1:]))
    elif change == "node added":
        f = facts("dgx-h100:4")
    elif change == "runtime":
        first = f.nodes[0]
        f = dataclasses.replace(
            f, nodes=(dataclasses.replace(first, runtime_version="cri-o://1.30.0"), *f.nodes[1:])
        )
    else:
        f = ClusterFacts.of(f.nodes, namespace="elsewhere", k8s_version="1.36.3", operator_env=IMAGES)
    result, _ = r._render(p, f)
    assert r.renders == 2
    expected = render(p, f)
    assert [o for s in result.states for o in s.objects] == [o for s in expected.states for o in s.objects]


@pytest.mark.parametrize("walked", [False, True])
def test_a_change_of_labels_no_code_read_reuses_the_render_until_labels_are_walked(walked: bool) -> None:
    """The renderer's reads are noted (render/readlabels.py): a label it never read (the MIG
    manager's state, say) changing on a node leaves the render valid, and a fresh render of the
    new facts is the same. Once any code has walked a node's labels as a whole, every label counts."""
    readlabels.forget()
    r = reconciler()
    base = facts("dgx-h100:3")
    first, _ = r._render(policy(), base)
    if walked:
        assert len(list(base.nodes[0].labels)) > 0
    moved = relabelled(base.nodes[1], "nvidia.com/mig.config.state", "success")
    changed = dataclasses.replace(base, nodes=(base.nodes[0], moved, *base.nodes[2:]))
    result, _ = r._render(policy(), changed)
    assert r.renders == (2 if walked else 1)
    assert (result is first) is not walked
    assert r.last_render is not None and r.last_render.facts is changed  # the next pass compares with these
    assert [o for s in result.states for o in s.objects] == [
        o for s in render(policy(), changed).states for o in s.objects
    ]
    read = relabelled(base.nodes[1], "feature.node.kubernetes.io/system-os_release.VERSION_ID", "24.04")
    r._render(policy(), dataclasses.replace(base, nodes=(base.nodes[0], read, *base.nodes[2:])))
    assert r.renders == (3 if walked else 2)  # a label the renderer read: rendered again
    readlabels.forget()


def test_labels_compare_on_the_keys_read_and_on_being_empty() -> None:
    readlabels.forget()
    a, b = readlabels.ReadLabels({"x": "1", "y": "1"}), readlabels.ReadLabels({"x": "1", "y": "2"})
    assert readlabels.same_read_labels(a, b)  # nothing read yet
    assert a.get("y") == "1"
    assert not readlabels.same_read_labels(a, b)
    assert "z" not in b  # read (noted), absent on both: equal
    assert not readlabels.same_read_labels(a, readlabels.ReadLabels({"x": "1", "y": "1", "z": ""}))
    assert (
        readlabels.same_read_labels(
            readlabels.ReadLabels({"x": "1"}), readlabels.ReadLabels({"x": "1", "z": ""})
        )
        is False
    )
    readlabels.forget()
    assert not readlabels.same_read_labels(readlabels.ReadLabels({}), readlabels.ReadLabels({"q": "1"}))
    assert a == readlabels.ReadLabels({"x": "1", "y": "1"}) and not readlabels.ReadLabels.walked
    assert a == {"x": "1", "y": "1"} and readlabels.ReadLabels.walked  # against a plain mapping: walked
    readlabels.forget()


def owner(uid: str = "u1") -> ClusterPolicyView:
    body: dict[str, Any] = {"metadata": {"name": "cluster-policy", "uid": uid}, "spec": {}}
    return ClusterPolicyView("cluster-policy", uid, 1, "t", body)


def test_the_applier_stamps_a_result_once_per_owner_reference() -> None:
    applier = Applier(object())  # type: ignore[arg-type]
    result = render(policy(), facts("dgx-h100:2"))
    view = owner()
    ref = owner_reference(view)
    stamped = applier._stamp(result, view, ref)
    assert applier._stamp(result, view, dict(ref)) is stamped  # an equal reference: reused
    assert all(v.applied_hash == body["metadata"]["annotations"][HASH_ANNOTATION] for _, body, v in stamped)
    other = render(policy(), facts("dgx-h100:2"))  # an equal result, but not the one reused
    assert applier._stamp(other, view, ref) is not stamped
    moved = owner("u2")
    assert (
        applier._stamp(other, moved, owner_reference(moved))[0][1]["metadata"]["ownerReferences"][0]["uid"]
        == "u2"
    )
    applier.forget_others({"u2"})
    assert set(applier._stamped) == {"u2"}


def node(name: str, **labels: str) -> NodeView:
    return NodeView.of_parts(name, labels, {}, runtime="containerd://2.0.0", kernel="6.8.0")


def test_the_nodes_are_summed_up_again_only_when_a_view_changed() -> None:
    r = reconciler()
    gpu = {"feature.node.kubernetes.io/pci-10de.present": "true"}
    views = (node("a", **gpu, **{"nvidia.com/gpu.present": "true"}), node("b", **gpu), node("c"))
    first = r.summary(views)
    assert (first.has_nfd, first.gpu_nodes, first.unlabelled) == (True, 1, 1)
    assert [f.name for f in first.facts] == ["a", "b", "c"]
    assert r.summary(tuple(views)) is first  # a new tuple of the same views (each pass's snapshot)
    assert r.summaries == 1
    labelled = node("b", **gpu, **{"nvidia.com/gpu.present": "true"})
    moved = r.summary((views[0], labelled, views[2]))
    assert r.summaries == 2
    assert (moved.gpu_nodes, moved.unlabelled) == (2, 0)
    assert moved.facts[1] is labelled.facts
    assert r.summary(views[:2]).gpu_nodes == 1  # a node gone
