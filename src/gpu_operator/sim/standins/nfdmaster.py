"""What Node Feature Discovery's master does with NodeFeature objects, for a simulator whose user
runs NFD (the chart's nfd.enabled=false on a cluster that has NFD): the labels of every
NodeFeature naming a node (label nfd.node.kubernetes.io/node-name) go onto that Node, and go
again when their NodeFeature does. Only on request (`sim up --nfd`, the tests' `nfd_master`
fixture): by default nothing plays NFD's master, as on a cluster without NFD.

Facts (kubernetes-sigs/node-feature-discovery v0.19.0, the version NVIDIA's chart pins; read for
facts only), pkg/nfd-master/nfd-master.go:
- `getAndMergeNodeFeatures`: a node's NodeFeatures (by the node-name label) sorted: NFD's own
  namespace first, then by name, then by namespace; their labels merged in that order, a later
  object's value winning (api/nfd/v1alpha1/feature.go `MergeInto`); a key without a prefix gets
  `feature.node.kubernetes.io/` (`addNsToMapKeys`).
- `filterFeatureLabel` (pkg/apis/nfd/validate `Label`): keys in kubernetes.io namespaces are
  refused unless feature.node/profile.node (or their subdomains) or listed in extraLabelNs
  (NVIDIA's chart lists nvidia.com); invalid keys or values are refused.
- `updateNodeObject`: the label keys it set are recorded, sorted, comma-joined, with the default
  prefix dropped, in the annotation `nfd.node.kubernetes.io/feature-labels`; keys recorded there
  and no longer wanted are removed, with the annotation when none is left; one JSON patch on the
  Node (`patchNode`), no field manager given, so the apiserver records client-go's user-agent
  prefix, the binary's name `nfd-master` (k8s.io/apiserver handlers/create.go
  `managerOrUserAgent`). Restrictions' default allowOverwrite (true): a value set by someone else
  is overwritten.
- `nfdAPIUpdateOneNode`: a node seen for the first time with no NodeFeature keeps its labels
  (a possibly incomplete cache at start-up); after that, or after a delete, they are removed.
Not played: NodeFeatureRules, extended resources, taints, feature annotations, instances
(`-instance`), NodeFeatureGroups, the garbage collector of NodeFeatures of deleted nodes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.operators import exists
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.sim.standins.gfd import NodeFeature
from gpu_operator.sim.standins.podwatch import Reflector, WorkQueue, run_together
from gpu_operator.vocabulary import LABEL_VALUE_PATTERN, NFD, NFD_NODE_NAME_LABEL

log = logging.getLogger("gpu_operator.sim.standins.nfdmaster")

FIELD_MANAGER = "nfd-master"
NAMESPACE = "node-feature-discovery"  # where NFD's own workers' NodeFeatures live (sorted first)
ANNOTATION_NS = "nfd.node.kubernetes.io"
FEATURE_LABELS_ANNOTATION = f"{ANNOTATION_NS}/feature-labels"
# the annotations `updateNodeObject` removes when it does not set them
MANAGED_ANNOTATIONS = tuple(
    f"{ANNOTATION_NS}/{n}"
    for n in (
        "feature-labels",
        "extended-resources",
        "feature-annotations",
        "master.version",
        "worker.version",
    )
)
PROFILE_NS = "profile.node.kubernetes.io"
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class FeatureView:
    namespace: str
    name: str
    node: str
    labels: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, obj: Any) -> FeatureView:
        meta = obj.metadata
        labels = (obj.get("spec") or {}).get("labels") or {}
        return cls(
            str(meta.namespace),
            str(meta.name),
            str((meta.labels or {}).get(NFD_NODE_NAME_LABEL, "")),
            tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        )


def with_ns(key: str) -> str:
    return key if "/" in key else f"{NFD}/{key}"


def merged_labels(features: list[FeatureView], own_namespace: str = NAMESPACE) -> dict[str, str]:
    """A node's NodeFeatures' labels, merged in NFD's order (later wins), default prefix added."""
    ordered = sorted(features, key=lambda f: (f.namespace != own_namespace, f.name, f.namespace))
    out: dict[str, str] = {}
    for feature in ordered:
        labels = dict(feature.labels)
        out.update({with_ns(k): v for k, v in labels.items() if "/" in k or with_ns(k) not in labels})
    return out


def allowed(key: str, value: str, extra_label_ns: tuple[str, ...] = ("nvidia.com",)) -> bool:
    """NFD's label validation (validate.Label and the master's namespace check)."""
    ns, _, name = key.rpartition("/")
    if not ns or len(ns) > 253 or not _SUBDOMAIN.match(ns) or len(name) > 63 or not _NAME.match(name):
        return False
    if len(value) > 63 or not re.match(LABEL_VALUE_PATTERN, value):
        return False
    if ns == "kubernetes.io" or ns.endswith(".kubernetes.io"):
        nfd_own = ns in (NFD, PROFILE_NS) or ns.endswith(f".{NFD}") or ns.endswith(f".{PROFILE_NS}")
        return nfd_own or ns in extra_label_ns
    return True


def _escape(key: str) -> str:
    return key.replace("/", "~1")


def patches(old: dict[str, str], remove: set[str], new: dict[str, str], path: str) -> list[dict[str, Any]]:
    """NFD's createPatches (allowOverwrite): remove what it owned and no longer wants, add or
    replace what it wants."""
    ops: list[dict[str, Any]] = [
        {"op": "remove", "path": f"{path}/{_escape(k)}"} for k in sorted(remove) if k in old and k not in new
    ]
    for key, value in sorted(new.items()):
        if key not in old:
            ops.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": value})
        elif old[key] != value:
            ops.append({"op": "replace", "path": f"{path}/{_escape(key)}", "value": value})
    return ops


def node_patch(
    labels: dict[str, str], annotations: dict[str, str], wanted: dict[str, str], skip_removal: bool
) -> list[dict[str, Any]]:
    """The JSON patch NFD's master sends for a node with `labels`/`annotations` that should carry
    the feature labels `wanted`."""
    new_annotations = {}
    if wanted:
        keys = sorted(k.removeprefix(f"{NFD}/") for k in wanted)
        new_annotations[FEATURE_LABELS_ANNOTATION] = ",".join(keys)
    old_labels = {with_ns(k) for k in annotations.get(FEATURE_LABELS_ANNOTATION, "").split(",") if k}
    remove_labels = set() if skip_removal else old_labels
    remove_annotations = set() if skip_removal else set(MANAGED_ANNOTATIONS)
    ops = patches(labels, remove_labels, wanted, "/metadata/labels")
    annotation_ops = patches(annotations, remove_annotations, new_annotations, "/metadata/annotations")
    if annotation_ops and not annotations and any(o["op"] == "add" for o in annotation_ops):
        annotation_ops = [{"op": "add", "path": "/metadata/annotations", "value": new_annotations}]
    return ops + annotation_ops


class NfdMaster:
    """NFD master's NodeFeature -> Node labels, on every node (NFD's master is not per node)."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str = NAMESPACE,
        extra_label_ns: tuple[str, ...] = ("nvidia.com",),
        concurrency: int = 8,
    ) -> None:
        self.client, self.namespace, self.extra_label_ns = client, namespace, extra_label_ns
        self.processed: set[str] = set()
        self.pending_delete: set[str] = set()
        self.queue = WorkQueue(self.handle, concurrency, "nfd-master")
        self.features = Reflector(
            client, NodeFeature, {NFD_NODE_NAME_LABEL: exists()}, FeatureView.of, self.changed, "NodeFeatures"
        )

    def changed(self, old: FeatureView | None, new: FeatureView | None) -> None:
        if old is not None and (new is None or new.node != old.node):
            self.pending_delete.add(old.node)
            self.queue.add(old.node)
        if new is not None and new.node:
            self.queue.add(new.node)

    async def handle(self, node: str) -> float | None:
        found = [f for f in self.features.objects.values() if f.node == node]
        wanted = {
            k: v
            for k, v in merged_labels(found, self.namespace).items()
            if allowed(k, v, self.extra_label_ns)
        }
        deleted = node in self.pending_delete
        self.pending_delete.discard(node)
        first = node not in self.processed
        self.processed.add(node)
        skip_removal = not wanted and not deleted and not found and first
        try:
            current = await self.client.get(Node, node)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise
        meta = current.metadata
        assert meta is not None
        ops = node_patch(dict(meta.labels or {}), dict(meta.annotations or {}), wanted, skip_removal)
        if ops:
            await self.client.patch(Node, node, ops, patch_type=PatchType.JSON, field_manager=FIELD_MANAGER)
            log.info(
                "node %s: NFD's master: %d label change(s) from %d NodeFeature(s)",
                node,
                sum(1 for o in ops if "/metadata/labels/" in o["path"]),
                len(found),
            )
        return None

    async def run(self) -> None:
        await run_together(
            [asyncio.create_task(self.features.run(), name="nodefeatures"), *self.queue.tasks()]
        )
