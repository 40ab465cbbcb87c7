"""NVIDIA's config-manager for the kwok nodes' stand-ins of the device plugin and GFD
(`sim/standins/kubeletdp.py`, `sim/standins/gfd.py`): which plugin config (`sim/standins/sharing.py`) the component's process
in a pod holds, through the channel the real one has.

The pod's wiring is read from the pod itself, as the real containers get it: a `config-manager`
container (the operator keeps it when devicePlugin.config.name is set) with NODE_LABEL,
DEFAULT_CONFIG, FALLBACK_STRATEGIES and CONFIG_FILE_SRCDIR, where the pod mounts the ConfigMap the
policy names; a pod without that container runs with the default (empty) config.

Facts (NVIDIA/k8s-device-plugin v0.20.0 cmd/config-manager/main.go, cmd/nvidia-device-plugin/
main.go; read for facts only): the init container (ONESHOT) links the chosen file before the
plugin starts (a failure stops the pod there); the sidecar watches the node's label (an informer
on the Node: a change of the label's value, or the label removed) and links the newly chosen file,
then sends SIGHUP to the process by its command name (hence the pod's shareProcessNamespace);
the plugin (and GFD) then restarts and reads the file afresh. Nothing watches the ConfigMap's
content: the link is to the same name, so an edit of the chosen key reaches the process only when
it starts again. A chosen name the ConfigMap lacks makes the sidecar exit; the process keeps the
config it has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.operators import exists
from lightkube.resources.core_v1 import ConfigMap, Node

from gpu_operator.sim.standins import sharing
from gpu_operator.sim.standins.podwatch import PodView, describe
from gpu_operator.vocabulary import DEVICE_PLUGIN_CONFIG

log = logging.getLogger("gpu_operator.sim.standins.pluginconfig")

SIDECAR = "config-manager"


def wiring(pod: PodView) -> tuple[str, str, str, list[str]] | None:
    """(the ConfigMap's name, the label, DEFAULT_CONFIG, FALLBACK_STRATEGIES) of the pod's
    config-manager; None where the pod has none (the default config)."""
    if SIDECAR not in pod.containers:
        return None
    srcdir = pod.env.get("CONFIG_FILE_SRCDIR", "")
    name = next((cm for container, path, cm in pod.configmaps if container == SIDECAR and path == srcdir), "")
    fallbacks = [f for f in pod.env.get("FALLBACK_STRATEGIES", "").split(",") if f]
    return (
        name,
        pod.env.get("NODE_LABEL") or DEVICE_PLUGIN_CONFIG,
        pod.env.get("DEFAULT_CONFIG", ""),
        fallbacks,
    )


def volume_reader(identities: Any, node: str) -> Any:
    """Who reads a pod's ConfigMap volumes on `node`: its kubelet (sim/standins/identity.py); None without
    identities (unit tests: the caller's one client)."""
    return None if identities is None else identities.kubelet_lazy(node, "kubelet")


class PluginConfigs:
    """What config each component's process holds, per (app, node); the label watch wakes the
    subscribed stand-ins of a node whose label changes."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], tuple[str, str, sharing.Sharing]] = {}  # -> (pod uid, key, config)
        self.wakers: list[Callable[[str], None]] = []
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, wake: Callable[[str], None]) -> None:
        self.wakers.append(wake)

    async def start(self, client: AsyncClient) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(client), name="plugin-config-labels")

    async def _watch(self, client: AsyncClient) -> None:
        """The sidecar's informer on the node label (one watch for all nodes; removal comes as a
        deletion from the label-selected watch)."""
        seen: dict[str, str | None] = {}
        while True:
            try:
                async for kind, obj in client.watch(Node, labels={DEVICE_PLUGIN_CONFIG: exists()}):
                    meta = obj.metadata
                    name = str(meta.name if meta else "")
                    value = (
                        None
                        if kind == "DELETED"
                        else ((meta.labels if meta else None) or {}).get(DEVICE_PLUGIN_CONFIG)
                    )
                    if seen.get(name) != value:
                        seen[name] = value
                        for wake in self.wakers:
                            wake(name)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - an outage: watch again
                log.debug("watching the nodes' device-plugin config label: %s", describe(err))
                await asyncio.sleep(1.0)

    def forget(self, app: str, node: str) -> None:
        self.held.pop((app, node), None)

    async def _files(self, client: AsyncClient, namespace: str, name: str) -> dict[str, str]:
        try:
            found = await client.get(ConfigMap, name, namespace=namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise
            raise sharing.SharingConfigError(
                f"devicePlugin.config.name: ConfigMap {namespace}/{name} not found: "
                "create it (the pod's volume cannot mount)"
            ) from err
        return dict(found.data or {})

    async def config(
        self, client: AsyncClient, node: str, pod: PodView, volumes: AsyncClient | None = None
    ) -> sharing.Sharing:
        """The config the process in `pod` on `node` holds now (SharingConfigError: it does not run). The
        config-manager reads the node's label with the pod's identity (`client`); the ConfigMap's
        files reach the pod as a volume, which the node's kubelet reads (`volumes`, else `client`):
        neither the plugin's nor GFD's Role may read ConfigMaps."""
        wired = wiring(pod)
        if wired is None:
            return sharing.Sharing()
        name, label, default, fallbacks = wired
        key = (pod.app, node)
        held = self.held.get(key)
        if held is not None and held[0] != pod.uid:
            held = None  # a new pod: its init container chooses afresh
        found = await client.get(Node, node)
        value = ((found.metadata.labels if found.metadata else None) or {}).get(label)
        files = await self._files(volumes or client, pod.namespace, name) if name else {}
        try:
            chosen = sharing.choose(value, list(files), default, fallbacks)
        except sharing.SharingConfigError as err:
            if held is None:
                raise
            log.info(
                "node %s: %s's config-manager: %s; the process keeps config %r", node, pod.app, err, held[1]
            )
            return held[2]
        if held is not None and held[1] == chosen:
            return held[2]  # the same link: no signal, nothing read again
        config = sharing.parse(files.get(chosen, ""), f"{name}[{chosen}]" if chosen else "config")
        self.held[key] = (pod.uid, chosen, config)
        if held is not None:
            log.info("node %s: %s's config-manager: config %r -> %r, SIGHUP", node, pod.app, held[1], chosen)
        return config
