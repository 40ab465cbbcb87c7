"""Our vGPU host-state agent on kwok nodes, which run no container: where the sandbox validator's pod
(app=nvidia-sandbox-validator) runs with its `vgpu-host-state` init container (the policy runs
sandbox workloads and has a vGPU device manager config), the agent's own pass
(`node.vgpuhost.agent.run_pass`: the desired state from the vGPU device manager's config under the
node's nvidia.com/vgpu.config, then MIG mode, VFs, a vGPU type per VF, Fabric Manager's mode;
the status file, the label nvidia.com/gpu.vgpu-host.state, the result annotation, an Event) runs
against the node's own host tree, with that init container's env (CONFIG_FILE, DEFAULT_VGPU_CONFIG,
DEFAULT_GPU_WORKLOAD_CONFIG, FABRIC_MODE) and the file its ConfigMap volume puts at CONFIG_FILE.
The same code as in the init container, not a re-implementation; what the container's tools do to
the GPUs (sriov-manage, nvidia-smi -mig, the writes to current_vgpu_type) is the vGPU host model's
(`sim/hardware/vgpuhw.py`), as the kernel and the vGPU manager would do it.

Which tree: the node's own (<hosts>/<node>/root), made from its shape's host at the first pass
(`faults.node_host_spec`), since the pass changes it; the GPUs' MIG mode beside it (vgpu.json).

When: once per pod, as an init container runs once per pod start: a new pod (after a rollout, or
after `sim fault NODE --reboot`, whose pods the kubelet ended at shutdown and whose DaemonSets made
new ones) runs it again. Before the pass, the container's own wait: while the vGPU manager's driver
is not ready on the host it waits (here: tried again in 5 s). A failed pass exits 1, and the
kubelet restarts the init container (here: tried again in 10 s); the pod's main container never
starts until a pass succeeds, and the stand-in does not mark the pod done either.

The pod's status says so, as the kubelet writes it (as the node's kubelet, `pods/status`): while
the container waits for the driver it is running, not ready; after a failed pass it waits in
CrashLoopBackOff with its last exit (1, Error) and a restart count; the init containers before it
terminated (Completed), those after it and the main container waiting (PodInitializing); phase
Pending, Initialized False (ContainersNotInitialized), Ready and ContainersReady False
(ContainersNotReady). So the DaemonSet counts the pod not ready. kwok's pod-ready stage leaves a pod
with Initialized False alone (`planeargs.hold_initializing`); once a pass succeeds, the stand-in
writes the pod Running and Ready (the init containers Completed), as the kubelet would.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import PatchType

from gpu_operator.node.cluster.kubeapi import KubeNodeView
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.vgpuhost.agent import Settings, run_pass
from gpu_operator.node.vgpuhost.cli import driver_ready
from gpu_operator.render.states import _vgpu_host_state, sandbox_validation
from gpu_operator.sim.hardware.faults import NodeHosts, node_host_spec
from gpu_operator.sim.hardware.vgpuhw import VGPU_STATE, VgpuHostSim, is_vgpu_host
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.sim.standins.probestandin import pod_to_play
from gpu_operator.vocabulary import NODE_AGENT_FIELD_MANAGER, VM_VGPU, WORKLOAD_CONFIG

log = logging.getLogger("gpu_operator.sim.standins")

APP = sandbox_validation.NAME  # the sandbox validator's pods: app=nvidia-sandbox-validator
INIT = _vgpu_host_state.NAME  # its init container, vgpu-host-state
DRIVER_ROOT = "/run/nvidia/driver"  # the command's --driver-root default, which the pod keeps
WAIT_DRIVER, RETRY_FAILED = 5.0, 10.0


@dataclass(frozen=True)
class InitContainer:
    """What the pass takes from the `vgpu-host-state` init container of one pod."""

    env: dict[str, str]
    config_map: str | None  # the ConfigMap whose key lands at CONFIG_FILE (None: no volume there)
    config_key: str
    optional: bool


def init_container(pod: Any) -> InitContainer | None:
    """The pod's vgpu-host-state init container (None: the pod has none: no vGPU device manager config)."""
    spec = pod.spec
    ctr = next((c for c in (spec.initContainers if spec else None) or [] if c.name == INIT), None)
    if ctr is None:
        return None
    env = {v.name: v.value or "" for v in ctr.env or [] if v.valueFrom is None}
    path = env.get("CONFIG_FILE", "/vgpu-config/config.yaml")
    volumes = {v.name: v for v in spec.volumes or []}
    for m in ctr.volumeMounts or []:
        volume = volumes.get(m.name)
        if volume is None or volume.configMap is None or not path.startswith(m.mountPath.rstrip("/") + "/"):
            continue
        key = posixpath.relpath(path, m.mountPath)
        item = next((i for i in volume.configMap.items or [] if i.path == key), None)
        return InitContainer(
            env, volume.configMap.name, item.key if item else key, bool(volume.configMap.optional)
        )
    return InitContainer(env, None, "", True)


class VgpuHostStandIn:
    """The vgpu-host-state init container's pass where the sandbox validator's pod runs with it.
    Unlike the probe's stand-in (`probestandin._OncePerPod`), a pass may wait for the driver or
    fail and be tried again: a pod is done only once its pass ran through."""

    app = APP
    field_manager = NODE_AGENT_FIELD_MANAGER
    # the pass's writes: its pod's ServiceAccount; the pod and its ConfigMap volume: the kubelet's reads
    identity = ident.POD
    identities: Any = None  # given by NodeStandIns (without: `client` and `self.client` for all)

    def __init__(self, config: Any, hosts: Path, client: Any = None) -> None:
        from lightkube import Client

        self.hosts = NodeHosts(hosts)  # the pass changes the tree: always the node's own
        self.client = client if client is not None else Client(config, field_manager=NODE_AGENT_FIELD_MANAGER)
        self.done: dict[str, str] = {}  # node -> uid of the pod whose pass ran through (or that has none)
        self.waiting: dict[str, str] = {}  # node -> why its pod waits for the driver (logged once)
        self.restarts: dict[str, int] = {}  # pod uid -> the init container's restarts (failed passes)
        self.shown: dict[str, tuple[bool, int]] = {}  # pod uid -> (failed, restarts) its status shows

    async def start(self, client: AsyncClient) -> None:
        return None

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        # a pod held in its init containers (by an earlier failed pass) is still this container's
        pod = pod_to_play(
            self.done, node, view, [replace(p, running=p.running or p.initializing) for p in pods]
        )
        if pod is None or view is None or view.shape is None:
            return None
        kubelet = (
            client if self.identities is None else await self.identities.kubelet(node, self.field_manager)
        )
        try:
            found = await kubelet.get(Pod, pod.name, namespace=pod.namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None  # gone: the watch brings its successor
            raise
        ctr = init_container(found)
        if ctr is None:
            self.done[node] = pod.uid
            return None
        text = await self._config_text(kubelet, pod.namespace, ctr)
        own = (
            self.client
            if self.identities is None
            else await self.identities.sync_for_pod(pod, self.field_manager)
        )
        delay = await asyncio.to_thread(self.run, node, view.shape.name, pod, ctr, text, own)
        if delay is None:
            self.done[node] = pod.uid
            self.restarts.pop(pod.uid, None)
            self.shown.pop(pod.uid, None)
            if pod.initializing:  # its init containers ran through: the kubelet starts the pod
                await kubelet.patch(
                    Pod.Status,
                    pod.name,
                    {"status": released_status(found)},
                    namespace=pod.namespace,
                    patch_type=PatchType.STRATEGIC,
                )
            return None
        failed = delay == RETRY_FAILED
        if failed:
            self.restarts[pod.uid] = self.restarts.get(pod.uid, 0) + 1
        shown = (failed, self.restarts.get(pod.uid, 0))
        if self.shown.get(pod.uid) != shown:  # the kubelet writes a status when it changes
            await kubelet.patch(
                Pod.Status,
                pod.name,
                {"status": held_status(found, *shown)},
                namespace=pod.namespace,
                patch_type=PatchType.STRATEGIC,
            )
            self.shown[pod.uid] = shown
        return delay

    async def _config_text(self, client: AsyncClient, namespace: str, ctr: InitContainer) -> str | None:
        """The file the ConfigMap volume puts at CONFIG_FILE; None where the container could not read it."""
        if ctr.config_map is None:
            return None
        try:
            found = await client.get(ConfigMap, ctr.config_map, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404 and ctr.optional:
                return None
            raise
        return (found.data or {}).get(ctr.config_key)

    def run(
        self, node: str, shape: str, pod: PodView, ctr: InitContainer, text: str | None, client: Any = None
    ) -> float | None:
        """The container's command for one pod; seconds until it is tried again, or None when done."""
        env = ctr.env
        view = KubeNodeView(
            node,
            pod.namespace,
            client=client if client is not None else self.client,
            component="gpu-operator-vgpu-host-state",
        )
        settings = Settings(
            config_text=text,
            config_source=env.get("CONFIG_FILE", "/vgpu-config/config.yaml"),
            default_config=env.get("DEFAULT_VGPU_CONFIG", "default"),
            default_workload=env.get("DEFAULT_GPU_WORKLOAD_CONFIG", "container"),
            fabric_mode=int(env["FABRIC_MODE"]) if env.get("FABRIC_MODE", "").isdigit() else None,
            fabric_mode_source="FABRIC_MODE (spec.vgpuManager.env NVFM_CONFIG_FABRIC_MODE)",
        )
        workload = view.node_metadata()[0].get(WORKLOAD_CONFIG) or settings.default_workload
        if workload != VM_VGPU:  # the command's first check: it exits at once, touching nothing
            log.info(
                "node %s: vGPU host state (pod %s): workload config is %s: nothing to keep",
                node,
                pod.name,
                workload,
            )
            return None
        spec = node_host_spec(shape)
        faults = self.hosts.faults(node, spec)
        fs = HostFS(faults.root)
        why, _, _ = driver_ready(fs, DRIVER_ROOT)
        if why is None and not is_vgpu_host(spec):
            why = f"shape {shape} has no vGPU host model (sim/hardware/vgpuhw.py)"
        if why is not None:  # the container waits (up to --wait-driver) and the pod stays in its init
            if self.waiting.get(node) != why:
                log.info(
                    "node %s: vGPU host state (pod %s) waiting for the vGPU manager: %s", node, pod.name, why
                )
            self.waiting[node] = why
            return WAIT_DRIVER
        self.waiting.pop(node, None)
        hardware = VgpuHostSim(fs, spec, faults.root.parent / VGPU_STATE)
        result = run_pass(fs, hardware, hardware, view, settings)
        log.info("node %s: vGPU host state (pod %s): %s", node, pod.name, result.state)
        return RETRY_FAILED if result.state == "failed" else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def held_status(pod: Any, failed: bool, restarts: int) -> dict[str, Any]:
    """The pod's status as the kubelet shows it while `vgpu-host-state` has not run through:
    running (waiting for the driver) or, after a failed pass, in CrashLoopBackOff."""
    now = _now()
    spec = pod.spec
    inits = list(spec.initContainers or [])
    at = [c.name for c in inits].index(INIT)
    statuses: list[dict[str, Any]] = []
    for i, ctr in enumerate(inits):
        entry: dict[str, Any] = {"name": ctr.name, "image": ctr.image, "ready": i < at, "restartCount": 0}
        if i < at:
            entry["state"] = {
                "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            }
        elif i > at:
            entry["state"] = {"waiting": {"reason": "PodInitializing"}}
        elif failed:
            entry["restartCount"] = restarts
            entry["state"] = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": (
                        f"back-off {int(RETRY_FAILED)}s restarting failed container={INIT} pod={pod.metadata.name}_"
                        f"{pod.metadata.namespace}({pod.metadata.uid})"
                    ),
                }
            }
            entry["lastState"] = {
                "terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}
            }
        else:
            entry["restartCount"] = restarts
            entry["state"] = {"running": {"startedAt": now}}
        statuses.append(entry)
    incomplete = " ".join(c.name for c in inits[at:])
    unready = " ".join(c.name for c in spec.containers)
    return {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Initialized",
                "status": "False",
                "reason": "ContainersNotInitialized",
                "message": f"containers with incomplete status: [{incomplete}]",
                "lastTransitionTime": now,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "ContainersNotReady",
                "message": f"containers with unready status: [{unready}]",
                "lastTransitionTime": now,
            },
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "ContainersNotReady",
                "message": f"containers with unready status: [{unready}]",
                "lastTransitionTime": now,
            },
        ],
        "initContainerStatuses": statuses,
        "containerStatuses": [
            {
                "name": c.name,
                "image": c.image,
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}},
            }
            for c in spec.containers
        ],
    }


def released_status(pod: Any) -> dict[str, Any]:
    """The pod's status once its init containers ran through: Running and Ready, as kwok's pod-ready
    stage would have made it (the kubelet writes it here: kwok has played that pod already)."""
    now = _now()
    spec = pod.spec
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
    return {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("Initialized", "Ready", "ContainersReady")
        ],
        "initContainerStatuses": [
            {"name": c.name, "image": c.image, "ready": True, "restartCount": 0, "state": done}
            for c in spec.initContainers or []
        ],
        "containerStatuses": [
            {
                "name": c.name,
                "image": c.image,
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in spec.containers
        ],
    }


def players(config: Any, hosts: Path, client: Any = None) -> list[VgpuHostStandIn]:
    """The vGPU host-state agent's stand-in (it needs the nodes' own host trees: `hosts`)."""
    return [VgpuHostStandIn(config, hosts, client=client)]
