"""What one reconcile reads besides the read model: the user's ConfigMaps (not watched), each GET at
most once per pass (`ReadOnce`), their keys for the driver's file-by-file mounts, and the hash of
the device plugin's config."""

from __future__ import annotations

from typing import Any, Protocol

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.kube.configwatch import content_hash


class ObjectReader(Protocol):
    """What reading an object takes: a Kube, or `ReadOnce` over one."""

    async def get_dict(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None: ...


class ReadOnce:
    """A Kube's get_dict for one reconcile, each object read at most once: the user's ConfigMaps it
    needs for keys, content and a hash (one may be named by more than one field) are GET once."""

    def __init__(self, kube: ObjectReader) -> None:
        self.kube = kube
        self.seen: dict[tuple[str, str, str, str | None], dict[str, Any] | None] = {}

    async def get_dict(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        key = (api_version, kind, name, namespace)
        if key not in self.seen:
            self.seen[key] = await self.kube.get_dict(api_version, kind, name, namespace=namespace)
        return self.seen[key]


async def configmap_keys(
    kube: ObjectReader, policy: ClusterPolicy, namespace: str
) -> dict[str, tuple[str, ...]]:
    """Keys of the user's ConfigMaps the driver mounts file by file (repo, certs, modules): the
    one read a reconcile makes besides the caches (user ConfigMaps are not watched). A missing
    ConfigMap is left out: rendering then names the field that refers to it."""
    driver = policy.spec.driver
    names = {
        ref
        for ref in (
            driver.repoConfig.configMapName if driver.repoConfig else None,
            driver.certConfig.name if driver.certConfig else None,
            driver.kernelModuleConfig.name if driver.kernelModuleConfig else None,
        )
        if ref
    }
    keys: dict[str, tuple[str, ...]] = {}
    for name in sorted(names):
        found = await kube.get_dict("v1", "ConfigMap", name, namespace=namespace)
        if found is not None:
            keys[name] = tuple(sorted({*(found.get("data") or {}), *(found.get("binaryData") or {})}))
    return keys


async def plugin_config_hash(kube: ObjectReader, policy: ClusterPolicy, namespace: str) -> str:
    """The hash of the devicePlugin.config ConfigMap's content ("" where none is named or it is
    missing): read once per reconcile, a change of it is an event (kube/configwatch.py)."""
    config = policy.spec.devicePlugin.config
    if config is None or not config.name:
        return ""
    found = await kube.get_dict("v1", "ConfigMap", config.name, namespace=namespace)
    return content_hash(found) if found is not None else ""
