"""Node labelling looks at a node again only when what it reads changed (controllers/units/labels/
labeller.py, `NodeLabeller._settled`): `desired_change` is pure, so a node whose labels,
annotations, GFD labels, driver and runtime group are as at its last look that found nothing to
change costs one comparison. Driver pod events and other units' writes (a condition, an
annotation labelling does not keep) mark nodes dirty without changing any of it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from gpu_operator.controllers.units.labels.gfdlabels import applied
from gpu_operator.controllers.units.labels.labeller import NodeLabeller
from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy, desired_change
from gpu_operator.controllers.views import NodeView
from gpu_operator.vocabulary import GPU_PRESENT

NFD_GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}


class Kube:
    def __init__(self) -> None:
        self.patches: list[str] = []

    async def merge_patch(
        self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> None:
        self.patches.append(name)


def settled(name: str, policy: LabelPolicy) -> NodeView:
    """A GPU node already labelled as `policy` wants."""
    change = desired_change(dict(NFD_GPU), {}, policy, node=name)
    view = NodeView.of_parts(name, applied(dict(NFD_GPU), change.labels), {}, runtime="containerd://2.0.0")
    assert not desired_change(view.labels, view.annotations, policy, node=name)
    return view


def test_a_node_is_looked_at_again_only_when_what_labelling_reads_changed() -> None:
    kube, policy = Kube(), LabelPolicy()
    labeller = NodeLabeller(kube, concurrency=4)  # type: ignore[arg-type]
    nodes = [settled(f"n{i}", policy) for i in range(10)]

    def label(views: list[NodeView], with_policy: LabelPolicy = policy) -> None:
        asyncio.run(labeller.label(views, with_policy, events=True))

    label(nodes)
    assert labeller.looked == 10 and kube.patches == []
    label(nodes)  # the same views again (driver pod events)
    label([dataclasses.replace(nodes[0], mig_condition=("True", "Applied", "ok"))])  # another unit's write
    assert labeller.looked == 10
    moved = dataclasses.replace(nodes[1], labels={**nodes[1].labels, GPU_PRESENT: "false"})
    label([moved])  # a label labelling decides: looked at, and patched
    assert labeller.looked == 11 and kube.patches == ["n1"]
    label([moved])  # still to change (the patch's echo has not come): looked at again
    assert labeller.looked == 12 and kube.patches == ["n1", "n1"]
    label(nodes[2:4], dataclasses.replace(policy, mig_manager_enabled=False))  # another policy
    assert labeller.looked == 14
