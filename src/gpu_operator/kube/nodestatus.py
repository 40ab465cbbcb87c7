"""Typed Node calls the GPU health signals and remediation need and `Kube` has no call for: one
Node condition by strategic merge (conditions merge by `type`: only ours is written, never the
kubelet's), the node's taint list replaced under its resourceVersion (taints have no merge key: a
concurrent change by anyone else makes the write fail with 409 instead of being lost)."""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator.kube.client import Kube
from gpu_operator.kube.resources import collection_path

SMP = "application/strategic-merge-patch+json"


def _status_path(node: str) -> str:
    return collection_path("", "v1", "nodes", name=urllib.parse.quote(node)) + "/status"


async def _patch_conditions(
    kube: Kube,
    node: str,
    item: dict[str, Any],
    *,
    missing_ok: bool,
    annotations: dict[str, str | None] | None = None,
) -> None:
    kube.write("patch", "Node/status")
    patch: dict[str, Any] = {"status": {"conditions": [item]}}
    if annotations:
        # the Node's status strategy keeps only the spec as it was: metadata merges through /status
        # too, so a condition and the annotations that go with it are one write
        patch["metadata"] = {"annotations": annotations}
    body = json.dumps(patch)
    response = await kube.http.patch(_status_path(node), content=body, headers={"Content-Type": SMP})
    if not (missing_ok and response.status_code == 404):
        response.raise_for_status()


async def set_condition(
    kube: Kube,
    node: str,
    kind: str,
    status: str,
    reason: str,
    message: str,
    *,
    moved: bool,
    annotations: dict[str, str | None] | None = None,
) -> None:
    """Set the condition of type `kind` of a Node (merged by type: the others are left as they
    are): its heartbeat now, and its transition time too where `moved` (its status changed);
    `annotations` (None: remove) in the same request."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    item = {"type": kind, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now}
    if moved:
        item["lastTransitionTime"] = now
    await _patch_conditions(kube, node, item, missing_ok=False, annotations=annotations)


async def delete_condition(kube: Kube, node: str, kind: str) -> None:
    """Remove the condition of type `kind` from a Node (a gone node is not an error)."""
    await _patch_conditions(kube, node, {"type": kind, "$patch": "delete"}, missing_ok=True)


async def drop_condition(kube: Kube, node: dict[str, Any], kind: str) -> bool:
    """Remove the condition of type `kind` where the listed `node` carries it; True when it did."""
    if not any(c.get("type") == kind for c in (node.get("status") or {}).get("conditions") or []):
        return False
    await delete_condition(kube, node["metadata"]["name"], kind)
    return True


Change = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


async def update_taints(kube: Kube, node: str, change: Change, *, tries: int = 3) -> bool:
    """Read the Node, `change` its taint list, write it back under the resourceVersion read
    (read again on a conflict). False when the node is gone or nothing changed."""
    for attempt in range(tries):
        body = await kube.get_dict("v1", "Node", node)
        if body is None:
            return False
        current = list((body.get("spec") or {}).get("taints") or [])
        wanted = change(current)
        if wanted == current:
            return False
        version = (body.get("metadata") or {}).get("resourceVersion")
        try:
            await kube.merge_patch(
                "v1",
                "Node",
                node,
                {"metadata": {"resourceVersion": version}, "spec": {"taints": wanted or None}},
            )
            return True
        except ApiError as err:
            if err.status.code != 409 or attempt == tries - 1:
                raise
    return False


async def put_request(kube: Kube, namespace: str, node: str, text: str | None) -> None:
    """GPU remediation's request to one node's health agent: its entry (data key = the node's name)
    in the requests Secret HEALTH_REQUESTS_SECRET, set to `text` or removed (None). A JSON merge
    patch touches that key only, so concurrent writes for other nodes are never lost; the Secret is
    created by the first request. Only the operator may write it (the chart's Role)."""
    import base64

    from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET, MANAGED_BY, MANAGED_BY_VALUE

    value = None if text is None else base64.b64encode(text.encode()).decode()
    for _ in range(3):
        try:
            await kube.merge_patch(
                "v1", "Secret", HEALTH_REQUESTS_SECRET, {"data": {node: value}}, namespace=namespace
            )
            return
        except ApiError as err:
            if err.status.code != 404:
                raise
        if value is None:
            return  # no Secret: nothing to withdraw
        from lightkube.resources.core_v1 import Secret

        kube.write("create", "Secret")
        try:
            await kube.client.create(
                Secret.from_dict(
                    {  # type: ignore[call-overload]
                        "metadata": {
                            "name": HEALTH_REQUESTS_SECRET,
                            "namespace": namespace,
                            "labels": {MANAGED_BY: MANAGED_BY_VALUE},
                        },
                        "type": "Opaque",
                        "data": {node: value},
                    }
                )
            )
            return
        except ApiError as err:
            if err.status.code != 409:  # created meanwhile for another node: patch it
                raise
    raise RuntimeError(f"could not write {namespace}/{HEALTH_REQUESTS_SECRET} for node {node}")
