"""One ConfigMap of the user's, watched by name, read only: the devicePlugin.config ConfigMap.

NVIDIA's config-manager (the device plugin's, GFD's and the MPS daemon's sidecar) re-links the
plugin's config file only when the node's `nvidia.com/device-plugin.config` label changes, so an
edit of the ConfigMap's content reaches the plugin only when its pod starts again
(NVIDIA/gpu-operator#1144). The operator watches that one ConfigMap (a field selector on its name,
in the operator's namespace, which the chart's Role lets it read; kopf's ConfigMap watch is selected
to the operator's own objects) and reports each change of its content; the ClusterPolicy
reconcile then stamps the content's hash on those pod templates, and their DaemonSets roll. It never
writes the ConfigMap."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lightkube.resources.core_v1 import ConfigMap

from gpu_operator.kube.client import Kube

log = logging.getLogger("gpu_operator.configwatch")


class ConfigMapWatch:
    """`follow(name)` watches that ConfigMap (None: none); `on_change(name)` is called when its
    content is first seen, changes, or the ConfigMap goes. One name at a time."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        on_change: Callable[[str], None],
        backoff: Callable[[int], float],
    ) -> None:
        self.kube, self.namespace, self.on_change, self.backoff = kube, namespace, on_change, backoff
        self.name: str | None = None
        self._task: asyncio.Task[None] | None = None

    def follow(self, name: str | None) -> None:
        if name == self.name:
            return
        self.name = name
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if name:
            log.info(
                "watching ConfigMap %s/%s (devicePlugin.config): an edit rolls the plugins' pods",
                self.namespace,
                name,
            )
            self._task = asyncio.create_task(self._run(name), name=f"configmap-{name}")

    async def stop(self) -> None:
        task, self._task, self.name = self._task, None, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, name: str) -> None:
        seen: str | None = None
        failures = 0
        while True:
            try:
                async for kind, obj in self.kube.client.watch(
                    ConfigMap, namespace=self.namespace, fields={"metadata.name": name}
                ):
                    failures = 0
                    content = (
                        ""
                        if kind == "DELETED"
                        else content_hash({"data": obj.data, "binaryData": obj.binaryData})
                    )
                    if content != seen:
                        seen = content
                        self.on_change(name)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - an outage or a refusal: watch again after the backoff
                failures += 1
                log.warning("watching ConfigMap %s/%s: %s", self.namespace, name, err)
                await asyncio.sleep(self.backoff(failures))


def content_hash(configmap: Mapping[str, Any]) -> str:
    """A hash of a ConfigMap's content (data and binaryData, not its metadata): equal content, equal
    hash (what the watch compares, and what the pod templates carry)."""
    content = {"data": configmap.get("data") or {}, "binaryData": configmap.get("binaryData") or {}}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
