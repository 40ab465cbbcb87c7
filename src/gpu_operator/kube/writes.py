"""Kube's writes: apply, delete, merge patch, status, Events, the Eviction API. Each one passes
`write` first (refused early without the leader Lease, else counted in WRITES); the fenced
transport (kube/client.py) refuses it again at the last moment."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.types import PatchType
from prometheus_client import Counter

from gpu_operator.kube import pages
from gpu_operator.kube.resources import FIELD_MANAGER, STATUS_RESOURCES, ObjectKey, resource_for

# Every write this process sends, by verb and kind: the idle-write benchmark and tests read it.
WRITES = Counter(
    "gpu_operator_api_write_requests", "Write requests sent to the Kubernetes API", ["verb", "kind"]
)

Fence = Callable[[], bool]


class NotLeading(RuntimeError):
    """A write refused by the leader-election fence."""


def refusal(what: str) -> NotLeading:
    return NotLeading(
        f"not sending {what}: this replica's leader Lease may have run out "
        "(not renewed in time: paused or cut off); it writes again only after "
        "renewing it, or stops if another replica holds it"
    )


class Writes:
    """The writing half of `Kube` (kube/client.py builds the clients these use)."""

    client: AsyncClient
    fence: Fence | None
    statuses_written: dict[tuple[str, str], dict[str, Any]]

    @property
    def http(self) -> httpx2.AsyncClient:
        raise NotImplementedError  # kube/client.py's Kube

    def write(self, verb: str, kind: str) -> None:
        """Every write of ours passes here first: refused early without the lease, else counted.
        (The transport refuses it again at the last moment.)"""
        if self.fence is not None and not self.fence():
            raise refusal(f"{verb} {kind}")
        WRITES.labels(verb, kind).inc()

    async def apply(self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> None:
        key = ObjectKey.of(obj)
        self.write("apply", key.kind)
        await self.client.patch(
            resource_for(key.api_version, key.kind),
            key.name,
            obj,
            namespace=key.namespace,
            patch_type=PatchType.APPLY,
            field_manager=field_manager,
            force=True,
        )

    async def apply_dry_run(self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """The object as the apiserver would store it after our server-side apply (dryRun=All: the
        server merges, defaults and validates, and persists nothing). Not counted as a write."""
        key = ObjectKey.of(obj)
        merged = await self.client.patch(
            resource_for(key.api_version, key.kind),
            key.name,
            obj,
            namespace=key.namespace,
            patch_type=PatchType.APPLY,
            field_manager=field_manager,
            force=True,
            dry_run=True,
        )
        return dict(merged.to_dict())

    async def delete(self, key: ObjectKey, *, orphan: bool = False, foreground: bool = False) -> bool:
        """Delete; False when it was already gone. `orphan` leaves the dependents (pods) running;
        `foreground` keeps the object until the garbage collector has deleted its dependents."""
        self.write("delete", key.kind)
        kwargs: dict[str, Any] = {"namespace": key.namespace} if key.namespace else {}
        if orphan or foreground:
            from lightkube.types import CascadeType

            kwargs["cascade"] = CascadeType.ORPHAN if orphan else CascadeType.FOREGROUND
        try:
            await self.client.delete(resource_for(key.api_version, key.kind), key.name, **kwargs)
        except ApiError as err:
            if err.status.code == 404:
                return False
            raise
        return True

    async def merge_patch(
        self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> None:
        self.write("patch", kind)
        await self.client.patch(
            resource_for(api_version, kind),
            name,
            patch,
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def patch_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status of one of our CRs (ClusterPolicy, NVIDIADriver, GPUCluster)."""
        self.write("patch", f"{kind}/status")
        await self.client.patch(
            STATUS_RESOURCES[kind].Status, name, {"status": status}, patch_type=PatchType.MERGE
        )
        self.statuses_written[(kind, name)] = status

    async def node_event(
        self, node: str, reason: str, message: str, *, warning: bool = True, namespace: str = "default"
    ) -> None:
        """A core/v1 Event about a Node (cluster-scoped objects' events live in `default`)."""
        await self.event(
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            reason,
            message,
            warning=warning,
            namespace=namespace,
        )

    async def event(
        self,
        involved: dict[str, str],
        reason: str,
        message: str,
        *,
        warning: bool = True,
        namespace: str = "default",
    ) -> None:
        """A core/v1 Event about any object (`involved`: apiVersion, kind, name, namespace?, uid?)."""
        from lightkube.models.core_v1 import EventSource, ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Event

        now = dt.datetime.now(dt.UTC)
        event = Event(
            metadata=ObjectMeta(
                generateName=f"{involved['name']}.", namespace=involved.get("namespace") or namespace
            ),
            involvedObject=ObjectReference(**involved),
            reason=reason,
            message=message,
            type="Warning" if warning else "Normal",
            source=EventSource(component="gpu-operator"),
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        self.write("create", "Event")
        await self.client.create(event)

    async def evict(self, namespace: str, name: str) -> pages.Evicted:
        """The Eviction API for one pod; a PodDisruptionBudget's refusal is in the answer."""
        self.write("create", "Eviction")
        return await pages.evict(self.http, namespace, name)
