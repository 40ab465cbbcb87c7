"""What NVIDIA's MIG manager does to a kwok node, which runs no container: while its pod (label
app=nvidia-mig-manager, the operator's DaemonSet) runs on the node, it watches the node's
`nvidia.com/mig.config` label and applies the selected config of its mig-parted config file to the
node's GPUs (`mighw`), through the node's labels as NVIDIA's does.

Facts (NVIDIA/mig-parted v0.15.0, the version the operator deploys; read for facts only):
- cmd/nvidia-mig-manager/main.go: watches label `nvidia.com/mig.config` of NODE_NAME; on start and
  on every change it runs the reconfiguration with the label's value. CONFIG_FILE, when set, is the
  config; otherwise it generates one from the GPUs' profiles (falling back to DEFAULT_CONFIG_FILE
  only when none is found) and publishes it as ConfigMap `<node>-mig-config`.
- pkg/mig/reconfigure/reconfigure.go `Run`, in order: read the deploy labels; `assert
  --valid-config` (failure: state `failed`); already applied: state `success`, nothing else;
  `nvidia.com/mig.config.state=pending`; pause the GPU clients: each of
  nvidia.com/gpu.deploy.{device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,nvsm} (and
  gpu.deploy.client when the node has it) set to `paused-for-mig-change`, a `false` kept `false`;
  wait (5 min at most, polling each second) until no pod app=nvidia-device-plugin-daemonset,
  gpu-feature-discovery, nvidia-dcgm-exporter, nvidia-dcgm of DEFAULT_GPU_CLIENTS_NAMESPACE is on
  the node (timeout: an error, no state written: the node stays pending and paused), then delete
  the pods app=nvidia-cuda-validator and app=nvidia-device-plugin-validator; apply the MIG mode
  (a GPU reset; where it fails and WITH_REBOOT is true: state `rebooting` and a reboot); apply the
  config (failure: state `failed`); delete the app=nvidia-operator-validator pod; restore the
  paused labels to `true` (a `false` stays); state `success`. Every failure after the pause also
  restores the labels with the state.

Played: all of the above with the rendered config file (CONFIG_FILE, else DEFAULT_CONFIG_FILE: the
rendered default lists the same layouts for our H100 as the generated one would). A GPU in use
refuses the change: `nvidia-mig-parted apply` (cmd/nvidia-mig-parted/apply/mode.go) resets all GPUs
after a MIG mode change, and the driver refuses a reset, and the destruction of an instance, while a
process holds the GPU; the manager then writes `failed` with its clients restored. On a kwok node
the GPUs' processes are the containers of its running pods that were given GPUs (a request of
nvidia.com/gpu* or nvidia.com/mig-*): which GPU each holds is not known here, so any such pod
refuses any change of layout. Otherwise the reset succeeds (a kwok node never reboots). Not played: the generated config and its ConfigMap,
host GPU clients (systemd), pods selected by gpu.deploy.client, CDI spec generation.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2 as httpx
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.operators import exists
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from gpu_operator.shapes import Shape
from gpu_operator.sim.hardware import migparted
from gpu_operator.sim.hardware.mighw import MigHardware
from gpu_operator.sim.hardware.migprofiles import LayoutError
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.pluginconfig import volume_reader
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView, describe
from gpu_operator.vocabulary import DEPLOY_PREFIX, MIG_CONFIG, MIG_MANAGER_FIELD_MANAGER

log = logging.getLogger("gpu_operator.sim.standins.migmanager")

APP = "nvidia-mig-manager"
FIELD_MANAGER = MIG_MANAGER_FIELD_MANAGER
MIG_CONFIG_STATE = f"{MIG_CONFIG}.state"
PAUSED = "paused-for-mig-change"
PAUSABLE = tuple(
    f"{DEPLOY_PREFIX}{c}" for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
)
CLIENT = f"{DEPLOY_PREFIX}client"
CLIENT_APPS = (
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
)
VALIDATOR_APPS = ("nvidia-cuda-validator", "nvidia-device-plugin-validator")
OPERATOR_VALIDATOR = "nvidia-operator-validator"
WAIT_TIMEOUT = 300.0
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")
TRANSPORT_TRIES = 5
T = TypeVar("T")


def paused(value: str | None) -> str:
    return "false" if value == "false" else PAUSED


def restored(value: str | None) -> str:
    return "false" if value == "false" else "true"


def deploy_changes(labels: dict[str, str], how: Callable[[str | None], str]) -> dict[str, str]:
    """The deploy labels the MIG manager writes to pause (`paused`) or restore (`restored`) clients."""
    out = {key: how(labels.get(key)) for key in PAUSABLE}
    if labels.get(CLIENT):
        out[CLIENT] = how(labels[CLIENT])
    return out


def config_source(pod: dict[str, Any]) -> tuple[str, str]:
    """(ConfigMap name, key) holding the pod's mig-parted config (CONFIG_FILE, else DEFAULT_CONFIG_FILE)."""
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    path = env.get("CONFIG_FILE") or env.get("DEFAULT_CONFIG_FILE")
    if not path:
        raise migparted.MIGConfigError(
            "the MIG manager's pod sets neither CONFIG_FILE nor DEFAULT_CONFIG_FILE"
        )
    for mount in container.get("volumeMounts") or []:
        rel = posixpath.relpath(path, mount["mountPath"])
        if rel.startswith(".."):
            continue
        volume: dict[str, Any] = next(
            (v for v in pod["spec"].get("volumes") or [] if v["name"] == mount["name"]), {}
        )
        cm = volume.get("configMap")
        if cm is None:
            break
        key = next((i["key"] for i in cm.get("items") or [] if i["path"] == rel), None)
        return cm["name"], key or rel
    raise migparted.MIGConfigError(
        f"the MIG manager's config {path} comes from no ConfigMap volume of its pod"
    )


def holds_gpus(pod: Pod) -> bool:
    """A container requests or limits a GPU resource of the device plugin (nvidia.com/gpu*, nvidia.com/mig-*)."""
    for container in (pod.spec.containers if pod.spec else None) or []:
        res = container.resources
        for section in (res.requests, res.limits) if res else ():
            if any(name.startswith(GPU_RESOURCES) for name in section or {}):
                return True
    return False


def _labels(node: Node) -> dict[str, str]:
    return dict((node.metadata.labels if node.metadata else None) or {})


class MigManager:
    """The MIG manager stand-in (a `podwatch.Player`)."""

    app = APP
    field_manager = FIELD_MANAGER
    identity = ident.POD  # its pod's ServiceAccount: the node's labels, the pods it waits for and deletes
    identities: Any = None  # given by NodeStandIns: the kubelet reads its config's ConfigMap volume

    def __init__(self, hardware: MigHardware, poll: float = 0.5, wait_timeout: float = WAIT_TIMEOUT) -> None:
        self.hardware, self.poll, self.wait_timeout = hardware, poll, wait_timeout
        self.wake: Callable[[str], None] = lambda _node: None
        self.done: dict[str, tuple[str, str]] = {}  # node -> (pod uid, config value) handled
        self.running: dict[str, asyncio.Task[None]] = {}
        self.on_nodes: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    async def start(self, client: AsyncClient) -> None:
        self._tasks.append(asyncio.create_task(self._watch_labels(client), name="mig-config-labels"))

    async def _watch_labels(self, client: AsyncClient) -> None:
        """Watch the nodes' `nvidia.com/mig.config` (the manager's informer); a change wakes the node."""
        seen: dict[str, str | None] = {}
        while True:
            try:
                async for _kind, obj in client.watch(Node, labels={MIG_CONFIG: exists()}):
                    meta = obj.metadata
                    name, value = (
                        str(meta.name if meta else ""),
                        ((meta.labels if meta else None) or {}).get(MIG_CONFIG),
                    )
                    if seen.get(name) != value:
                        seen[name] = value
                        if name in self.on_nodes:
                            self.wake(name)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - an outage: watch again
                log.debug("watching the nodes' MIG config: %s", describe(err))
                await asyncio.sleep(1.0)

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        if view is None or view.shape is None or not running or not view.nvidia_gpus:
            self.on_nodes.discard(node)
            self.done.pop(node, None)
            task = self.running.pop(node, None)
            if task is not None:
                task.cancel()
            return None
        self.on_nodes.add(node)
        pod = running[-1]
        task = self.running.get(node)
        if task is not None and not task.done():
            if self.done.get(node, ("",))[0] == pod.uid:
                return None
            task.cancel()  # its pod is gone (a new one runs): the process died with it
        labels = dict(_labels(await client.get(Node, node)))
        value = labels.get(MIG_CONFIG)
        if value is None or self.done.get(node) == (pod.uid, value):
            return None
        self.done[node] = (pod.uid, value)
        task = asyncio.create_task(self.reconfigure(client, node, view.shape, pod, value), name=f"mig-{node}")
        self.running[node] = task
        task.add_done_callback(lambda _t: self.wake(node))  # a change while it ran is seen then
        return None

    async def label(self, client: AsyncClient, node: str, labels: dict[str, str]) -> None:
        async def patched() -> Node:
            return await client.patch(
                Node,
                node,
                {"metadata": {"labels": labels}},
                patch_type=PatchType.MERGE,
                field_manager=FIELD_MANAGER,
            )

        await self._unhurried(patched)

    async def reconfigure(
        self, client: AsyncClient, node: str, shape: Shape, pod: PodView, value: str
    ) -> None:
        try:
            await self._reconfigure(client, node, shape, pod, value)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the real one logs and waits for the next change
            log.warning("node %s: MIG manager: %s", node, describe(err))

    async def _reconfigure(
        self, client: AsyncClient, node: str, shape: Shape, pod: PodView, value: str
    ) -> None:
        labels = dict(_labels(await client.get(Node, node)))

        async def state(result: str, why: str = "") -> None:
            await self.label(client, node, {**deploy_changes(labels, restored), MIG_CONFIG_STATE: result})
            log.info("node %s: MIG config %s: %s%s", node, value, result, f" ({why})" if why else "")

        try:
            found = await client.get(Pod, pod.name, namespace=pod.namespace)
            name, key = config_source(found.to_dict())
            volumes = volume_reader(self.identities, node) or client  # the file mig-parted reads: a volume
            cm = await volumes.get(ConfigMap, name, namespace=pod.namespace)
            entries = migparted.select(migparted.parse((cm.data or {}).get(key, "")), value)
        except (migparted.MIGConfigError, ApiError) as err:
            await state("failed", str(err))
            return
        gpus = self.hardware.gpus(node, shape)
        if migparted.applied(entries, gpus):
            await state("success", "already applied")
            return
        await self.label(client, node, {MIG_CONFIG_STATE: "pending"})
        await self.label(client, node, deploy_changes(labels, paused))
        log.info("node %s: MIG config %s pending; GPU clients paused", node, value)
        await self._wait_clients_gone(client, node, pod.namespace)
        for app in VALIDATOR_APPS:
            await self._delete_pods(client, node, pod.namespace, app)
        holders = await self._gpu_pods(client, node)
        try:
            if holders:
                raise LayoutError(
                    f"the GPUs are in use by another client ({', '.join(holders)}): the driver refuses "
                    "the reset of a MIG mode change and the destruction of an instance in use"
                )
            result = migparted.apply(entries, gpus)  # a MIG mode change: a GPU reset, which works here
        except LayoutError as err:
            await state("failed", str(err))
            return
        self.hardware.set(node, shape, result)
        await self._delete_pods(client, node, pod.namespace, OPERATOR_VALIDATOR)
        await self.label(client, node, deploy_changes(labels, restored))
        await self.label(client, node, {MIG_CONFIG_STATE: "success"})
        layouts = sorted({str(g.layout()) for g in result})
        log.info(
            "node %s: MIG config %s applied to %d GPUs: %s", node, value, len(result), "; ".join(layouts)
        )

    async def _pods(self, client: AsyncClient, node: str, namespace: str, app: str) -> list[Pod]:
        async def listed() -> list[Pod]:
            return [
                p
                async for p in client.list(
                    Pod, namespace=namespace, labels={"app": app}, fields={"spec.nodeName": node}
                )
            ]

        return await self._unhurried(listed)

    async def _unhurried(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, again after a request that never got an answer (a timeout, a connection): every
        node's MIG manager here shares one client and its connections, which a real one, a process
        per node, does not; an answer of the apiserver (ApiError) is not retried."""
        for attempt in range(TRANSPORT_TRIES):
            try:
                return await call()
            except ApiError:
                raise
            except (httpx.TransportError, OSError) as err:
                if attempt == TRANSPORT_TRIES - 1:
                    raise
                log.debug("MIG manager: %s; trying again", describe(err))
                await asyncio.sleep(self.poll)
        raise AssertionError("unreachable")

    async def _gpu_pods(self, client: AsyncClient, node: str) -> list[str]:
        """The node's running pods given GPUs by the kubelet (their processes hold the GPUs), namespace/name;
        not those being deleted (the validator pods it just deleted: finished, holding nothing)."""

        async def listed() -> list[str]:
            return [
                f"{meta.namespace}/{meta.name}"
                async for p in client.list(
                    Pod, namespace="*", fields={"spec.nodeName": node, "status.phase": "Running"}
                )
                if (meta := p.metadata) is not None and not meta.deletionTimestamp and holds_gpus(p)
            ]

        return sorted(await self._unhurried(listed))

    async def _wait_clients_gone(self, client: AsyncClient, node: str, namespace: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_timeout
        for app in CLIENT_APPS:
            while await self._pods(client, node, namespace, app):
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"{app} pod did not shutdown; the node stays {MIG_CONFIG_STATE}=pending"
                    )
                await asyncio.sleep(self.poll)

    async def _delete_pods(self, client: AsyncClient, node: str, namespace: str, app: str) -> None:
        for found in await self._pods(client, node, namespace, app):
            try:
                await client.delete(
                    Pod, str(found.metadata.name if found.metadata else ""), namespace=namespace
                )
            except ApiError as err:
                if err.status.code != 404:
                    raise
