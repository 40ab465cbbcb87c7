"""Taking back what we wrote on nodes: the labels and annotations under nvidia.com/ that the
operator, the node agents or the MIG manager we deploy set (their field managers own them in the
node's managedFields).

A key someone else wrote last (a user's `nvidia.com/gpu.deploy.driver=false`, the workload config
label, the passthrough device list) is owned by that writer and stays. Used when the last
ClusterPolicy is deleted (the operator's label loop) and by `gpu-operator cleanup` (the chart's
pre-delete hook; admin/cleanup.py).

What a unit wrote besides those keys (a condition, a taint, a cordon, objects of its own) its folder
takes back: `controllers/units/<name>/takeback.py`, one `TakeBack` step each, which the cleanup
command runs in the order of the registry (controllers/units/__init__.py, `take_backs`), handed an
`Uninstall`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator.controllers.customresources import CUSTOM_RESOURCES
from gpu_operator.kube.client import FIELD_MANAGER, Kube
from gpu_operator.vocabulary import MIG_MANAGER_FIELD_MANAGER, NODE_AGENT_FIELD_MANAGER, NVIDIA

log = logging.getLogger("gpu_operator.cleanup")
OUR_MANAGERS = frozenset({FIELD_MANAGER, NODE_AGENT_FIELD_MANAGER, MIG_MANAGER_FIELD_MANAGER})


def _keys(fields: dict[str, Any]) -> set[str]:
    return {key[2:] for key in fields if key.startswith("f:")}


def owned_keys(
    metadata: dict[str, Any], managers: frozenset[str] = OUR_MANAGERS
) -> tuple[set[str], set[str]]:
    """(labels, annotations) under nvidia.com/ that `managers` own on this object, and only those."""
    present_labels = set(metadata.get("labels") or {})
    present_annotations = set(metadata.get("annotations") or {})
    labels: set[str] = set()
    annotations: set[str] = set()
    for entry in metadata.get("managedFields") or []:
        if entry.get("manager") not in managers:
            continue
        meta = (entry.get("fieldsV1") or {}).get("f:metadata") or {}
        labels |= _keys(meta.get("f:labels") or {})
        annotations |= _keys(meta.get("f:annotations") or {})
    ours = f"{NVIDIA}/"
    return (
        {k for k in labels & present_labels if k.startswith(ours)},
        {k for k in annotations & present_annotations if k.startswith(ours)},
    )


def cleanup_patch(node: dict[str, Any], keep: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The merge patch that removes our keys (but the labels in `keep`) from a node, or None when
    it carries none."""
    labels, annotations = owned_keys(node.get("metadata") or {})
    labels -= keep
    if not labels and not annotations:
        return None
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict.fromkeys(sorted(labels))
    if annotations:
        metadata["annotations"] = dict.fromkeys(sorted(annotations))
    return {"metadata": metadata}


async def strip_nodes(
    kube: Kube, keep: dict[str, frozenset[str]] | None = None, only: set[str] | None = None
) -> list[str]:
    """Remove our labels and annotations from every node (or the nodes in `only`), but the labels
    `keep` names per node; returns the nodes patched."""
    patched = []
    for node in await kube.list_dicts("v1", "Node"):
        if only is not None and node["metadata"]["name"] not in only:
            continue
        patch = cleanup_patch(node, (keep or {}).get(node["metadata"]["name"], frozenset()))
        if patch is None:
            continue
        name = node["metadata"]["name"]
        try:
            await kube.merge_patch("v1", "Node", name, patch)
        except ApiError as err:
            if err.status.code == 404:
                continue  # the node left meanwhile
            raise
        removed = sorted({*patch["metadata"].get("labels", {}), *patch["metadata"].get("annotations", {})})
        log.info("node %s: removed %s", name, ", ".join(removed))
        patched.append(name)
    return patched


# Our CRs (controllers/customresources.py), the rows in reverse: the GPUCluster first, as its
# finalizer is removed by the running operator once the pods holding ResourceClaims are gone (the
# hook stops the operator only after every owner CR is gone).
OWNER_KINDS = tuple((row.api_version, row.kind) for row in reversed(CUSTOM_RESOURCES))


@dataclass(frozen=True)
class Uninstall:
    """What `gpu-operator cleanup` hands each unit's take-back step, once our CRs are gone and the
    operator stopped: the client, every node as listed once before the first step (a step reads the
    record a unit kept there, e.g. whose cordon it is, before the last step takes our annotations),
    and the stopped operator's namespace (None when the command did not stop it: what the operator
    made in its namespace stays then, as the running operator would make it again)."""

    kube: Kube
    nodes: list[dict[str, Any]]
    namespace: str | None = None


TakeBack = Callable[[Uninstall], Awaitable[list[str]]]
"""One unit's take-back step (its folder's takeback.py, `take_back`): lines for the log."""


async def each_node(
    nodes: list[dict[str, Any]], step: Callable[[dict[str, Any]], Awaitable[list[str]]]
) -> list[str]:
    """Run a per-node take-back on every node; each thing it did, logged and returned as
    `node NAME: what`. A node that left meanwhile (404) is passed over."""
    done = []
    for node in nodes:
        name = node["metadata"]["name"]
        try:
            undone = await step(node)
        except ApiError as err:
            if err.status.code == 404:
                continue
            raise
        for what in undone:
            log.info("node %s: %s", name, what)
            done.append(f"node {name}: {what}")
    return done
