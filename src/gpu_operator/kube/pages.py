"""Lists, plain GETs and the eviction, as HTTP (the client's fenced transport): every item of a
list page by page, pods decoded slim (msgspec builds only what the upgrade controller reads), a
GET's answer whatever it is (must-gather, the apiserver probe), and the Eviction API with its
refusal read from the answer."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
import msgspec


class _Env(msgspec.Struct, omit_defaults=True):
    name: str = ""
    value: str | None = None


class _Container(msgspec.Struct, omit_defaults=True):
    env: list[_Env] | None = None


class _OwnerRef(msgspec.Struct, omit_defaults=True):
    kind: str = ""
    uid: str = ""
    controller: bool | None = None


class _PodMeta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""  # where the driver pod watch resumes (kube/driverpodwatch.py)
    labels: dict[str, str] | None = None
    ownerReferences: list[_OwnerRef] | None = None
    deletionTimestamp: str | None = None


class _PodSpec(msgspec.Struct, omit_defaults=True):
    nodeName: str | None = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None


class _ContainerStatus(msgspec.Struct, omit_defaults=True):
    ready: bool = False
    restartCount: int = 0


class _PodStatus(msgspec.Struct, omit_defaults=True):
    phase: str = ""
    containerStatuses: list[_ContainerStatus] | None = None


class SlimPod(msgspec.Struct, omit_defaults=True):
    """The part of a pod a slim list or the driver pod watch builds (owners, labels, node, env,
    readiness); the decoder skips the rest."""

    metadata: _PodMeta = msgspec.field(default_factory=_PodMeta)
    spec: _PodSpec | None = None
    status: _PodStatus | None = None


class _PodList(msgspec.Struct):
    items: list[SlimPod] | None = None
    metadata: dict[str, Any] | None = None


_decode_pods = msgspec.json.Decoder(_PodList).decode


async def list_all(
    http: httpx2.AsyncClient,
    path: str,
    params: Mapping[str, str] | None = None,
    *,
    slim_pods: bool = False,
    page_size: int = 500,
) -> list[dict[str, Any]]:
    """Every item of a list, page by page. `slim_pods`: pods decoded as `SlimPod`. Label and field
    selectors are passed to the apiserver as they are, so it does the matching."""
    items: list[dict[str, Any]] = []
    query = {"limit": str(page_size), **(params or {})}
    while True:
        response = await http.get(path, params=query)
        response.raise_for_status()
        if slim_pods:
            page = _decode_pods(response.content)
            items.extend(msgspec.to_builtins(p) for p in page.items or [])
            meta = page.metadata or {}
        else:
            body = response.json()
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
        cont = meta.get("continue")
        if not cont:
            return items
        query["continue"] = cont


async def count(http: httpx2.AsyncClient, path: str) -> int | None:
    """How many items the list at `path` has, from one item and the apiserver's
    metadata.remainingItemCount (no full list); None when the path is not served (404)."""
    response = await http.get(path, params={"limit": "1"})
    if response.status_code == 404:
        return None
    response.raise_for_status()
    body = response.json()
    return len(body.get("items") or []) + int((body.get("metadata") or {}).get("remainingItemCount") or 0)


@dataclass(frozen=True)
class Evicted:
    """What the Eviction API answered: done (or the pod was gone), or refused by a budget."""

    refused_by: str | None = None  # "namespace/pdb" when a PodDisruptionBudget refused it (429)


async def evict(http: httpx2.AsyncClient, namespace: str, name: str) -> Evicted:
    path = f"/api/v1/namespaces/{namespace}/pods/{urllib.parse.quote(name)}/eviction"
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    response = await http.post(path, json=body)
    if response.status_code == 429:
        return Evicted(f"{namespace}/{pdb_name(response.json())}")
    if response.status_code not in (200, 201, 404):
        response.raise_for_status()
    return Evicted()


def pdb_name(status: Mapping[str, Any]) -> str:
    """The PodDisruptionBudget named in a refused eviction's Status (cause DisruptionBudget:
    'The disruption budget NAME needs ...'); '?' when the apiserver did not say."""
    for cause in (status.get("details") or {}).get("causes") or []:
        message = cause.get("message", "")
        if cause.get("reason") == "DisruptionBudget" and message.startswith("The disruption budget "):
            return str(message).removeprefix("The disruption budget ").split(" ", 1)[0]
    return "?"


@dataclass(frozen=True)
class Answer:
    """A GET's answer: its status and text, or (status None) why there was none; `path` is
    what was asked (for a report naming it)."""

    status: int | None
    text: str = ""
    error: str = ""
    path: str = ""

    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def reason(self) -> str:
        """The apiserver's message (or the text's start), for a status that is not 200."""
        try:
            body = self.json()
        except ValueError:
            return " ".join(self.text.split())[:200]
        return str(body.get("message") or body.get("reason") or "") if isinstance(body, dict) else ""


async def get(
    http: httpx2.AsyncClient, path: str, params: Mapping[str, str] | None = None, timeout: float | None = None
) -> Answer:
    kwargs: dict[str, Any] = {"params": dict(params or {})}
    if timeout is not None:
        kwargs["timeout"] = timeout
    try:
        response = await http.get(path, **kwargs)
    except httpx2.HTTPError as err:
        return Answer(None, error=f"{type(err).__name__}: {err}", path=path)
    return Answer(response.status_code, response.text, path=path)
