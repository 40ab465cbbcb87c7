"""GPU feature discovery's labels on the Node, without NFD: a pure decision of node labelling.

GFD publishes its labels in a NodeFeature object (`nvidia-features-for-<node>`, in its pod's
namespace, the operator's); NFD's master would turn that into Node labels. Where the chart runs
our node discovery instead of NFD, node labelling does that part itself, in the same patch as the
node's deploy labels: it writes the object's `nvidia.com/` labels (nothing of another prefix, none
of the keys the operator decides itself) and lists their keys in the annotation
`nvidia.com/gpu-operator.gfd.labels`, so it removes exactly what it wrote when GFD stops publishing
them for the node: the object goes (GFD disabled, uninstalled: the garbage collector deletes it with
GFD's DaemonSet), or GFD no longer runs there (its deploy label removed or `false`: the object
stays, owned by the DaemonSet, and is ignored). While the MIG manager pauses GFD
(`paused-for-mig-change`) the labels stay, as NFD keeps them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_operator.vocabulary import (
    ALL_DEPLOY_LABELS,
    DEPLOY_PREFIX,
    DRIVER_OWNER,
    GFD_LABELS_ANNOTATION,
    GPU_PRESENT,
    LABEL_VALUE_PATTERN,
    MIG_CONFIG,
    NVIDIA,
    UPGRADE_STATE,
    WORKLOAD_CONFIG,
    deploy_label,
)

GFD_DEPLOY = deploy_label("gpu-feature-discovery")
_PREFIX = f"{NVIDIA}/"
_VALUE = re.compile(LABEL_VALUE_PATTERN)
# Keys the operator (or the user, or the MIG manager) owns: GFD has no say over them.
_NOT_GFDS = frozenset(
    {GPU_PRESENT, MIG_CONFIG, DRIVER_OWNER, UPGRADE_STATE, WORKLOAD_CONFIG, *ALL_DEPLOY_LABELS}
)


@dataclass(frozen=True)
class GfdChange:
    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)


def mirrored(key: str, value: str) -> bool:
    """Whether a NodeFeature label of GFD's may go on the Node: `nvidia.com/` only, no key the
    operator decides, a value Kubernetes accepts (one bad value must not fail the node's patch)."""
    return (
        key.startswith(_PREFIX)
        and key not in _NOT_GFDS
        and not key.startswith(DEPLOY_PREFIX)
        and len(value) <= 63
        and _VALUE.match(value) is not None
    )


def written(annotations: Mapping[str, str]) -> set[str]:
    """The keys this mirror wrote (the annotation lists them without the `nvidia.com/` prefix)."""
    text = annotations.get(GFD_LABELS_ANNOTATION) or ""
    return {_PREFIX + name for name in text.split(",") if name}


def gfd_runs(labels: Mapping[str, str]) -> bool:
    """GFD's DaemonSet selects the node (or the MIG manager paused it there for a while)."""
    value = labels.get(GFD_DEPLOY)
    return bool(value) and value != "false"


def gfd_change(
    labels: Mapping[str, str], annotations: Mapping[str, str], published: Mapping[str, str] | None
) -> GfdChange:
    """What to change so the node carries exactly `published` (GFD's labels for it; None: GFD
    publishes nothing for this node now) of what this mirror owns."""
    want = {k: v for k, v in (published or {}).items() if mirrored(k, v)}
    had = written(annotations)
    change: dict[str, str | None] = {k: v for k, v in want.items() if labels.get(k) != v}
    change.update({k: None for k in had - want.keys() if k in labels})
    # ours: what we write now, and what we wrote before and still mirror (a label NFD or a person
    # already set to the same value stays theirs, and is never removed by us)
    listed = ",".join(sorted(k.removeprefix(_PREFIX) for k in want if k in change or k in had))
    notes: dict[str, str | None] = {}
    if listed != (annotations.get(GFD_LABELS_ANNOTATION) or ""):
        notes[GFD_LABELS_ANNOTATION] = listed or None
    return GfdChange(change, notes)


def applied(labels: dict[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
    """The labels after a change (None removes); `labels` itself when there is none (no copy)."""
    if not change:
        return labels
    out = dict(labels)
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out
