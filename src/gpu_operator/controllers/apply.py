"""The one apply/delete contract of every owner CR (ClusterPolicy, NVIDIADriver).

The render result is the only source of truth: its objects are the apply set. Whatever the owner
(by uid) owns and no state renders any more is deleted, except the kinds the result says to keep
(`RenderResult.keep_kinds`); the DaemonSets of a state marked `orphan_pods` are deleted leaving
their pods running. Objects of a kind the operator does not watch (the OpenShift SCC; a
ServiceMonitor when its CRD was not there at start-up) are remembered here, so they too are
applied once and deleted when no longer rendered.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator.controllers import adopt
from gpu_operator.controllers import status as st
from gpu_operator.controllers.loop import Result
from gpu_operator.controllers.views import CRView, OwnedKey, OwnedView, desired_hash, object_key
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.render import RenderResult
from gpu_operator.vocabulary import HASH_ANNOTATION

TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
Stamped = tuple[OwnedKey, dict[str, Any], OwnedView]  # a rendered object as applied: key, body, view
SELECTOR_RETRY = 1.0  # seconds until the DaemonSet deleted for a new selector is created again


def immutable_selector(err: ApiError, obj: dict[str, Any]) -> bool:
    """The apiserver refused our apply of a DaemonSet because `spec.selector` differs from the
    live one's (422 Invalid, the cause's field `spec.selector`)."""
    status = err.status
    if obj.get("kind") != "DaemonSet" or status.code != 422 or status.details is None:
        return False
    return any(cause.field == "spec.selector" for cause in status.details.causes or [])


def template_generation(daemonset: dict[str, Any] | None) -> int:
    """A live DaemonSet's template generation (apps/v1 shows it as an annotation; 1 if absent)."""
    annotations = ((daemonset or {}).get("metadata") or {}).get("annotations") or {}
    try:
        return max(1, int(annotations.get(TEMPLATE_GENERATION, "1")))
    except ValueError:
        return 1


def recreated(daemonset: dict[str, Any], generation: int) -> dict[str, Any]:
    """The DaemonSet created again after its selector change, starting at `generation`: the pods it
    adopts carry the deleted one's `pod-template-generation` label, and the DaemonSet controller
    counts a pod whose label equals the DaemonSet's template generation as up to date whatever its
    template (Kubernetes' IsPodUpdated), so a new one at generation 1 would keep every adopted pod
    of a deleted one at generation 1 (NVIDIA's, after a take-over) and never roll it. The
    apiserver takes the annotation as the template generation at create (apps/v1 conversion)."""
    meta = daemonset["metadata"]
    annotations = {**(meta.get("annotations") or {}), TEMPLATE_GENERATION: str(generation)}
    return {**daemonset, "metadata": {**meta, "annotations": annotations}}


def owner_reference(
    policy: CRView[Any], api_version: str = "nvidia.com/v1", kind: str = "ClusterPolicy"
) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": policy.name,
        "uid": policy.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_ownership(
    obj: dict[str, Any],
    policy: CRView[Any],
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The object as we apply it: owned by the policy (or `owner`, a ready ownerReference) and
    stamped with the hash of itself."""
    meta = dict(obj["metadata"])
    meta["ownerReferences"] = [owner or owner_reference(policy)]
    owned = {**obj, "metadata": meta}
    meta["annotations"] = {**(meta.get("annotations") or {}), HASH_ANNOTATION: desired_hash(owned)}
    return owned


@dataclass
class Applied(Result):
    """What apply passes wrote, and when to look again (a reconcile's report extends it)."""

    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


@dataclass
class ReconcileReport(Applied):
    """What an owner CR's reconcile did (for logs, metrics and tests): its writes, and more."""

    outcome: st.ReconcileOutcome | None = None
    not_ready: list[str] = field(default_factory=list)
    has_nfd: bool = False
    gpu_nodes: int = 0
    extra_conditions: list[dict[str, str]] = field(default_factory=list)


class Applier:
    """Applies render results for owner CRs; remembers, per owner uid, the objects it applied of
    kinds the operator does not watch (memory only: after a restart each is applied once again,
    and one whose state was disabled while the operator was down is not deleted)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.remembered: dict[str, dict[OwnedKey, OwnedView]] = {}
        self.swept: set[str] = set()  # owners whose previous operator's leftovers were swept
        # owner uid -> (the render result, the owner reference, what _stamp made of them)
        self._stamped: dict[str, tuple[RenderResult, dict[str, Any], list[Stamped]]] = {}
        # DaemonSets deleted for their selector, to be created again: the template generation the
        # new one starts at (see recreated())
        self._recreate: dict[OwnedKey, int] = {}

    async def apply(
        self,
        result: RenderResult,
        owner: CRView[Any],
        owner_ref: dict[str, Any],
        owned: Mapping[OwnedKey, OwnedView],
        watched_kinds: Collection[str],
        done: Applied,
    ) -> None:
        """Apply what changed (by hash), then delete what this owner owns and no longer renders;
        each write is added to `done` as it happens."""
        known = {
            **{k: v for k, v in self.remembered.get(owner.uid, {}).items() if v.kind not in watched_kinds},
            **owned,
        }
        orphaning = {s.name for s in result.states if s.orphan_pods}
        desired: dict[OwnedKey, OwnedView] = {}
        for key, applied, view in self._stamp(result, owner, owner_ref):
            desired[key] = view
            live = known.get(key)
            if live and live.applied_hash == view.applied_hash:
                continue
            generation = self._recreate.get(key)
            try:
                await self.kube.apply(applied if generation is None else recreated(applied, generation))
            except ApiError as err:
                if not immutable_selector(err, applied):
                    raise
                # A DaemonSet of the same name with another selector (another operator's, or an
                # earlier render's): the selector cannot change in place. Deleted leaving its pods
                # (and ControllerRevisions), so the DaemonSet created next pass adopts the pods
                # its selector matches and rolls those whose template differs.
                ref = ObjectKey.of(applied)
                live_ds = await self.kube.get_dict(ref.api_version, ref.kind, ref.name, ref.namespace)
                self._recreate[key] = template_generation(live_ds) + 1
                if await self.kube.delete(ref, orphan=True):
                    done.deleted.append(f"{ref} (selector changed; orphaning its pods)")
                done.requeue = min(done.requeue or SELECTOR_RETRY, SELECTOR_RETRY)
                continue
            self._recreate.pop(key, None)
            done.applied.append(str(ObjectKey.of(applied)))
        # Ownership is checked against the owner's uid, so objects someone else created (or another
        # owner CR owns) are never touched.
        for key, live in known.items():
            if key in desired or owner.uid not in live.owner_uids or live.kind in result.keep_kinds:
                continue
            orphan = live.kind == "DaemonSet" and live.state in orphaning
            ref = ObjectKey(live.api_version, live.kind, live.name, live.namespace)
            if await self.kube.delete(ref, orphan=orphan):
                done.deleted.append(str(ref) + (" (orphaning its pods)" if orphan else ""))
        # Once per owner and process: what a previous operator left owned by the same CR (docs/migrate.md).
        if owner.uid not in self.swept:
            namespaces = {k[2] for k in desired if k[2]}
            done.deleted.extend(
                await adopt.sweep(self.kube, owner.uid, namespaces, desired, result.keep_kinds)
            )
            self.swept.add(owner.uid)
        # Everything desired of an unwatched kind now exists as applied; nothing else of those does.
        self.remembered[owner.uid] = {k: v for k, v in desired.items() if v.kind not in watched_kinds}

    def _stamp(self, result: RenderResult, owner: CRView[Any], owner_ref: dict[str, Any]) -> list[Stamped]:
        """Each rendered object as applied (`with_ownership`), its key and view; the same list again
        for the same render result and owner reference (a reconcile reuses an unchanged render:
        hashing ~50 objects each pass is the cost this saves)."""
        last = self._stamped.get(owner.uid)
        if last is not None and last[0] is result and last[1] == owner_ref:
            return last[2]
        stamped = []
        for obj in result.objects():
            applied = with_ownership(obj, owner, owner_ref)
            meta = applied["metadata"]
            key = object_key(applied["apiVersion"], applied["kind"], meta.get("namespace"), meta["name"])
            stamped.append((key, applied, OwnedView.of(applied)))
        self._stamped[owner.uid] = (result, owner_ref, stamped)
        return stamped

    async def verify_remembered(self, owner_uid: str) -> list[str]:
        """Read back what is remembered for an owner (reads only): an object someone deleted or
        changed is forgotten, so the next apply writes it again. Returns what was forgotten."""
        kept = self.remembered.get(owner_uid, {})
        forgotten = []
        for key, view in list(kept.items()):
            live = await self.kube.get_dict(view.api_version, view.kind, view.name, view.namespace)
            hash_now = ((live or {}).get("metadata", {}).get("annotations") or {}).get(HASH_ANNOTATION)
            if hash_now != view.applied_hash:
                del kept[key]
                forgotten.append(str(ObjectKey(view.api_version, view.kind, view.name, view.namespace)))
        return forgotten

    def forget_others(self, uids: Collection[str]) -> None:
        """Drop what is remembered for owners that no longer exist (the garbage collector took
        their objects)."""
        for uid in [u for u in self.remembered if u not in uids]:
            del self.remembered[uid]
        for uid in [u for u in self._stamped if u not in uids]:
            del self._stamped[uid]
