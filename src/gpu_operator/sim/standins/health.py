"""Our GPU health agent on kwok nodes, which run no container: where the operator-validator pod
(label app=nvidia-operator-validator) runs with its `gpu-health` container, the agent's own code
(`node.health.HealthAgent`: kernel log, PCI bus, the driver's /proc entries, validator status
files; for a live agent NVML too, as the tree and its fault book answer: `sim/hardware/nvmltree.py`) runs
against the node's host tree, and each changed report goes out through the agent's
own publisher (`AnnotationPublisher`: one merge patch of the Node annotation
nvidia.com/gpu-health.report, as the node agents' field manager) -- the same code path as in the
pod, not a re-implementation. The validations it expects come from the container's
HEALTH_VALIDATIONS, as in the pod.

Which tree: a node that never had a fault reads the tree of its shape's host (`faults.node_host_spec`,
one per shape, built under <hosts>/.shared); `gpu-operator sim fault` gives the node a tree of its
own (<hosts>/<node>/root) and announces it in <hosts>/changes, which this follows.

What it costs, so that 5,000 quiet nodes cost nothing: when the pod starts on a node the agent
takes one look (its first report, one patch) and is put away; nothing is stepped on a node whose
host did not change. Nodes that read their shape's tree read the same files with the same
options, so the agent's first report (and its last, `stopped`) there is computed once per shape
and set of validations, by the agent, and published for each such node (a look costs ~5-10 ms
per 8-GPU tree here, mostly path resolution; one patch per node stays). A node whose tree holds a fault keeps a live agent, stepped every `interval`
seconds (an Xid warning lapses with time), until `--clear`. A live agent is made at the node's
first fault on its shape's tree (what the host was when the pod started) and then pointed at the
node's own tree, so it sees the change as an agent that ran all along does: a GPU that left the
bus is `gone`, the kernel log's new records are judged.

Remediation's requests (the node's entry in the operator's requests Secret, which only the
operator writes; node/health/requests.py) are carried out by the agent's own code (`node.health.requests.RequestActor`)
for a node with a live agent (remediation only asks of a node whose GPUs are unhealthy, and that
node's tree holds the fault): its Node and the requests Secret are read at each step, a reset is played on the tree by
`HostFaults.reset` (that GPU's Xids forgotten, the boot kept; a GPU gone from the bus stays gone)
instead of `nvidia-smi -r`, and a reboot request creates kured's sentinel in the tree
(/var/run/reboot-required). There is no kured here: whoever plays the reboot runs
`gpu-operator sim fault NODE --clear`.

`--clear` is a reboot (a new boot_id in the tree): the pod restarts with the node, so a new agent
takes over, its first report says what the host is now. When the pod stops, the agent's last
report (marked `stopped`) is published, as the agent does on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from gpu_operator.node.health import AnnotationPublisher, HealthAgent, encode, inventory
from gpu_operator.node.health.command import NO_VALIDATIONS
from gpu_operator.node.health.requests import RequestActor, Resetter, Seen
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.validate.config import STATUS_FILES
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.hardware.faults import (
    VALIDATED,
    ChangeFollower,
    FaultError,
    NodeHosts,
    boot_id,
    follow_changes,
    node_host_spec,
    validator_wrote,
)
from gpu_operator.sim.hardware.nvmltree import TreeNvml
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.vocabulary import HEALTH_VALIDATIONS, NODE_AGENT_FIELD_MANAGER, VALIDATIONS_DIR

log = logging.getLogger("gpu_operator.sim.standins.health")

APP = "nvidia-operator-validator"
CONTAINER = "gpu-health"
VALIDATIONS_ENV = "HEALTH_VALIDATIONS"
INTERVAL = 2.0  # seconds between two steps of a live agent, and two looks at the changes journal


def validations(pod: PodView) -> tuple[str, ...] | None:
    """The validations the pod's agent expects (its HEALTH_VALIDATIONS), None: the agent's default."""
    raw = pod.env.get(VALIDATIONS_ENV)
    if not raw:  # unset or empty: the agent's default (its option reads an empty variable as unset)
        return None
    if raw.strip().lower() == NO_VALIDATIONS:
        return ()
    return tuple(v.strip() for v in raw.split(",") if v.strip())


class Live:
    """A node's live agent: the agent, the HostFS it reads (re-rooted at the node's own tree),
    and the boot it started in."""

    def __init__(self, agent: HealthAgent, fs: HostFS, boot: str) -> None:
        self.agent, self.fs, self.boot = agent, fs, boot


class HealthStandIn:
    """The health agent on kwok nodes (a `podwatch.Player`)."""

    app = APP
    field_manager = NODE_AGENT_FIELD_MANAGER
    identity = ident.POD  # the operator-validator pod's ServiceAccount (sim/standins/identity.py)
    identities: Any = None  # given by NodeStandIns (without: `client`, one for all pods)

    def __init__(self, config: Any, hosts: Path, interval: float = INTERVAL, client: Any = None) -> None:
        from lightkube import Client

        self.hosts = NodeHosts(hosts)
        self.interval = interval
        # the agent's publisher takes the node agents' (sync) client
        self.client = client if client is not None else Client(config, field_manager=NODE_AGENT_FIELD_MANAGER)
        self.published: dict[str, str] = {}  # node -> the report text on its Node
        self.pods: dict[str, str] = {}  # node -> uid of the pod whose agent we play
        self.live: dict[str, Live] = {}
        self.publishers: dict[str, AnnotationPublisher] = {}
        self.shared: dict[str, Path] = {}
        # (shape, validations) -> the agent's first and last report on that shape's tree
        self.looks: dict[tuple[str, tuple[str, ...] | None], tuple[str, str]] = {}
        self.wake: Callable[[str], None] = lambda _node: None
        self.patches = 0

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    async def start(self, client: AsyncClient) -> None:
        shutil.rmtree(self.hosts.base / ".shared", ignore_errors=True)
        # the nodes `sim fault` announces, where the agent runs (one stat of the journal per interval when quiet)
        self._task = asyncio.create_task(
            follow_changes(ChangeFollower(self.hosts.base), self.interval, self._woken), name="health-changes"
        )

    def _woken(self, node: str) -> None:
        if node in self.pods:
            self.wake(node)

    def shared_root(self, shape: str) -> Path:
        if shape not in self.shared:
            root = self.hosts.base / ".shared" / shape
            shutil.rmtree(root, ignore_errors=True)
            spec = node_host_spec(shape)
            hosttree.build(spec, root)
            # read only by agents of running validator pods, whose init containers passed (a vGPU
            # host's validator checks the vGPU manager instead)
            if not spec.get("vgpu"):
                validator_wrote(HostFS(root))
            self.shared[shape] = root
        return self.shared[shape]

    def first_look(self, node: str, shape: str, wanted: tuple[str, ...] | None) -> tuple[str, str]:
        """The agent's first report, and its last as it stops, on `shape`'s tree."""
        key = (shape, wanted)
        if key not in self.looks:
            agent = self._agent(node, HostFS(self.shared_root(shape)), wanted)
            first = encode(agent.observe())
            self.looks[key] = (first, encode(agent.final()))
            agent.close()
        return self.looks[key]

    def _agent(
        self, node: str, fs: HostFS, wanted: tuple[str, ...] | None, *, acts: bool = False
    ) -> HealthAgent:
        extra: dict[str, Any] = {} if wanted is None else {"validations": wanted}
        say = lambda m: log.info("node %s: health agent: %s", node, m)  # noqa: E731
        # no process of a tree is this agent (own_pid -1): every holder there counts
        requests = RequestActor(fs, self._resetter(node), own_pid=-1, log=say) if acts else None
        # a live agent reads NVML as the tree and its fault book answer (sim/hardware/nvmltree.py); the
        # shared-tree look (one per shape) reads the host's files only, as it costs one look per shape
        nvml = {"nvml": True, "nvml_module": TreeNvml(fs)} if acts else {"nvml": False}
        return HealthAgent(fs, node, log=say, requests=requests, **nvml, **extra)

    def _resetter(self, node: str) -> Resetter:
        """`nvidia-smi -r -i BUS` played on the node's own tree."""

        def reset(bus: str) -> tuple[bool, str]:
            if not self.hosts.has(node):
                return False, "the node has no host tree of its own"
            try:
                self.hosts.faults(node).reset(bus)
            except FaultError as err:
                return False, str(err)
            return True, ""

        return reset

    async def own_client(self, node: str, pods: list[PodView]) -> Any:
        """The agent's (sync) client: its pod's ServiceAccount; once its pod is gone, the kubelet's."""
        if self.identities is None:
            return self.client
        return await self.identities.sync_for_pods(node, pods, self.field_manager)

    async def publish(self, node: str, text: str, client: Any = None) -> None:
        if self.published.get(node) == text:
            return
        client = client if client is not None else self.client
        publisher = self.publishers.get(node)
        if publisher is None or publisher.client is not client:
            publisher = self.publishers[node] = AnnotationPublisher(node, client=client)
        await publisher.publish(text)
        self.published[node] = text
        self.patches += 1
        log.info("node %s: GPU health report published: %s", node, text)

    def _close(self, node: str) -> None:
        live = self.live.pop(node, None)
        if live is not None:
            live.agent.close()

    def forget(self, node: str) -> None:
        self._close(node)
        for table in (self.published, self.pods, self.publishers):
            table.pop(node, None)

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        if view is None or view.shape is None:
            self.forget(node)
            return None
        running = sorted(
            (p for p in pods if p.running and CONTAINER in p.containers), key=lambda p: (p.started, p.name)
        )
        if not running:
            if node in self.pods:
                await self.stopped(node, view, pods)
            return None
        pod = running[-1]
        shape, own = view.shape.name, self.hosts.root(node)
        live = self.live.get(node)
        if live is not None and self.pods.get(node) != pod.uid:
            self._close(node)  # its pod is gone (a new one runs): the new pod's agent starts afresh
            live = None
        if live is not None and self.hosts.has(node) and boot_id(live.fs) != live.boot:
            self._close(node)  # rebooted: the pod restarts with the node
            live = None
            self.pods.pop(node, None)
        if live is None:
            fresh = self.pods.get(node) != pod.uid
            if fresh and not self.hosts.has(node):  # the agent starts now, on its shape's host
                self.pods[node] = pod.uid
                await self.publish(
                    node,
                    self.first_look(node, shape, validations(pod))[0],
                    client=await self.own_client(node, [pod]),
                )
                return None
            if fresh:  # the agent starts now, on the host as it is
                fs = HostFS(own)
                wanted = validations(pod)  # what its checks write now
                validator_wrote(fs, HEALTH_VALIDATIONS if wanted is None else wanted)
            elif self.hosts.has_faults(
                node
            ):  # a fault on a host that was as its shape's when the agent started
                fs = HostFS(self.shared_root(shape))
            else:
                return None  # nothing changed since its last report
            live = Live(self._agent(node, fs, validations(pod), acts=True), fs, boot_id(fs))
            if self.hosts.has(node) and fs.root != own.resolve():
                # the node's own tree was made after its validator pod started (born with no
                # status file): what that pod's init containers wrote at its start, and the GPUs
                # its agent found then (node/health/inventory.py), are on the host
                carried = [n for n in VALIDATED if fs.exists(f"{VALIDATIONS_DIR}/{STATUS_FILES[n]}")]
                validator_wrote(HostFS(own), carried, when=float(pod.started))
                inventory.write(HostFS(own), inventory.boot_id(HostFS(own)), live.agent.baseline.pci)
                fs.root = own.resolve()  # the same agent, now reading the node's own host
                live.boot = boot_id(fs)
            self.live[node], self.pods[node] = live, pod.uid
        found = await client.get(Node, node)
        meta = found.metadata
        seen = Seen(
            (meta.labels if meta else None) or {},
            (meta.annotations if meta else None) or {},
            await self.request(client, node, pod.namespace),
        )
        live.agent.act(seen)
        await live.agent.step()
        if live.agent.last is not None:
            await self.publish(node, live.agent.last, client=await self.own_client(node, [pod]))
        if self.hosts.has_faults(node) or live.agent.marks:
            return self.interval
        self._close(node)  # quiet: put away until its host changes
        return None

    async def request(self, client: AsyncClient, node: str, namespace: str) -> str | None:
        """The node's entry in the operator's requests Secret (in the validator pod's namespace, the
        operator's), as the agent's RequestWatch keeps it."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Secret

        from gpu_operator.node.cluster.kubeapi import request_entry
        from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET

        try:
            return request_entry(await client.get(Secret, HEALTH_REQUESTS_SECRET, namespace=namespace), node)
        except ApiError as err:
            # 403: an identity whose Role does not name the Secret (the DRA validator's: remediation
            # is off under a GPUCluster). The agent's RequestWatch logs the refusal and keeps
            # reporting without requests; so does the stand-in (the refusal is on record).
            if err.status.code in (403, 404):
                return None
            raise

    async def stopped(self, node: str, view: StandinNodeView, pods: list[PodView]) -> None:
        """The pod went: the agent's last report, marked stopped."""
        live = self.live.get(node)
        wanted = validations(pods[-1]) if pods else None
        if live is not None:
            final = encode(live.agent.final())
        elif self.hosts.has(node):
            agent = self._agent(node, HostFS(self.hosts.root(node)), wanted)
            final = encode(agent.final())
            agent.close()
        else:
            assert view.shape is not None
            final = self.first_look(node, view.shape.name, wanted)[1]
        await self.publish(node, final, client=await self.own_client(node, pods))
        self.forget(node)
