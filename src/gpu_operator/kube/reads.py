"""Kube's reads, named by what they read (a kind's list, a pod's log, the apiserver's version
or readiness), never by URL: the paths are built here and in kube/pages.py. Lists go page by
page; the `read_*` calls answer whatever the apiserver said (must-gather, the readiness probe)
and never raise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError

from gpu_operator.kube import pages
from gpu_operator.kube.resources import collection_path, resource_for

VERSION_PATH = "/version"
READYZ_PATH = "/readyz"
# resource.k8s.io versions whose ResourceClaim allocation names each device's driver and pool
# (status.allocation.devices.results), newest first: v1 from Kubernetes 1.34, v1beta2 1.33,
# v1beta1 1.32
RESOURCE_CLAIM_VERSIONS = ("v1", "v1beta2", "v1beta1")


def _selectors(labels: str | None, fields: str | None) -> dict[str, str]:
    params = {"labelSelector": labels} if labels else {}
    if fields:
        params["fieldSelector"] = fields
    return params


class Reads:
    """The reading half of `Kube` (kube/client.py builds the clients these use)."""

    client: AsyncClient

    @property
    def http(self) -> httpx2.AsyncClient:
        raise NotImplementedError  # kube/client.py's Kube

    # -- objects through lightkube, by apiVersion and kind

    async def list_dicts(
        self, api_version: str, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        res = resource_for(api_version, kind)
        kwargs: dict[str, Any] = {"labels": labels} if labels else {}
        if namespace:
            kwargs["namespace"] = namespace
        return [obj.to_dict() async for obj in self.client.list(res, **kwargs)]

    async def get_dict(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            obj = await self.client.get(resource_for(api_version, kind), name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise
        return dict(obj.to_dict())

    # -- lists as HTTP, by group, version and plural (raw selector strings, slim pods)

    async def list_items(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        slim_pods: bool = False,
    ) -> list[dict[str, Any]]:
        """Every item of a kind (in `namespace`, else in all), page by page; `labels` and `fields`
        are selector strings the apiserver matches. Raises for an HTTP error."""
        return await self.list_all(
            collection_path(group, version, plural, namespace),
            _selectors(labels, fields),
            slim_pods=slim_pods,
        )

    async def list_pods(
        self,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        slim: bool = False,
    ) -> list[dict[str, Any]]:
        """Pods (in `namespace`, else in all) matching the selector strings; `slim`: decoded as
        kube/pages.py's SlimPod (owners, labels, node, env, readiness only)."""
        return await self.list_items(
            "", "v1", "pods", namespace, labels=labels, fields=fields, slim_pods=slim
        )

    async def list_resource_claims(self, namespace: str | None = None) -> list[dict[str, Any]] | None:
        """ResourceClaims (in `namespace`, else in all) at the newest version of RESOURCE_CLAIM_VERSIONS
        the apiserver serves; None when it serves none (no DRA, e.g. Kubernetes 1.29 by default)."""
        for version in RESOURCE_CLAIM_VERSIONS:
            try:
                return await self.list_items("resource.k8s.io", version, "resourceclaims", namespace)
            except httpx2.HTTPStatusError as err:
                if err.response.status_code != 404:
                    raise
        return None

    async def count_items(self, group: str, version: str, plural: str) -> int | None:
        """How many objects of a kind exist in all namespaces (one item fetched); None when the
        kind is not served."""
        return await self.count(collection_path(group, version, plural))

    # -- answers that never raise

    async def read_list(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> pages.Answer:
        """One page of a kind's list as the apiserver answered it (`params`: selectors, limit,
        continue); the answer names its path."""
        return await self.get_answer(collection_path(group, version, plural, namespace), params)

    async def read_version(self) -> pages.Answer:
        """The apiserver's /version, as answered."""
        return await self.get_answer(VERSION_PATH)

    async def read_readyz(self, timeout: float | None = None) -> pages.Answer:
        """The apiserver's own /readyz (readable by everyone), as answered."""
        return await self.get_answer(READYZ_PATH, timeout=timeout)

    async def read_pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        timeout: float | None = None,
    ) -> pages.Answer:
        """A container's log (its last `tail_lines` lines; `previous`: the run before its restart),
        as answered: the apiserver fetches it from the node's kubelet."""
        params = {"container": container, "tailLines": str(tail_lines)}
        if previous:
            params["previous"] = "true"
        return await self.get_answer(
            collection_path("", "v1", "pods", namespace, f"{pod}/log"), params, timeout
        )

    # -- by path: the calls above, and kube/ itself

    async def list_all(
        self, path: str, params: Mapping[str, str] | None = None, *, slim_pods: bool = False
    ) -> list[dict[str, Any]]:
        """Every item of the list at `path`, page by page (kube/pages.py)."""
        return await pages.list_all(self.http, path, params, slim_pods=slim_pods)

    async def count(self, path: str) -> int | None:
        """How many objects the list at `path` holds (one item fetched); None when not served."""
        return await pages.count(self.http, path)

    async def get_answer(
        self, path: str, params: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> pages.Answer:
        """A GET of any path: its status and text, or why there was no answer (never raises for
        an HTTP status or a transport error)."""
        return await pages.get(self.http, path, params, timeout)

    # -- discovery

    async def served_versions(self, group: str, kind: str) -> list[str]:
        """The versions of an API group that serve `kind`, as discovery lists them (preferred first);
        empty when the group is not served."""
        response = await self.http.get(f"/apis/{group}")
        if response.status_code == 404:
            return []
        response.raise_for_status()
        versions = [v["version"] for v in response.json().get("versions") or []]
        serving = []
        for version in versions:
            listing = await self.http.get(f"/apis/{group}/{version}")
            if listing.status_code == 404:
                continue
            listing.raise_for_status()
            if any(r.get("kind") == kind for r in listing.json().get("resources") or []):
                serving.append(version)
        return serving

    async def server_version(self) -> str:
        """The apiserver's gitVersion without the leading v ("1.36.3"); /version has no resource type."""
        response = await self.http.get(VERSION_PATH)
        response.raise_for_status()
        return str(response.json().get("gitVersion", "")).lstrip("v")
