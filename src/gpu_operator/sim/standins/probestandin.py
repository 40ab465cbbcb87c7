"""Our GPU probe and vfio manager on kwok nodes, which run no container: where the probe's pod
(label app=nvidia-gpu-probe) runs, the probe's own publish step (`node.cluster.publish.publish_once`:
probe, findings, the driver-source/version/probe-status labels, the `nvidia.com/gpu.probe.facts`
annotation, Events) runs against the node's host tree, with the node agents' field manager and
the `--default-workload` its pod was started with; where the vfio manager's pod
(app=nvidia-vfio-manager) runs, its own reconcile pass (`node.vfio.incluster.reconcile`: select the
node's passthrough GPUs from its labels and annotations, bind, record the outcome label
`nvidia.com/gpu.vfio.state` and the result annotation). The same code as in the pods, not a
re-implementation. Both DaemonSets exist only where the policy runs sandbox workloads
(sandboxWorkloads.enabled) and land only on nodes whose workload is vm-passthrough: a node
without those pods gets none of these facts, as a real node would not.

Which tree: the node's own (<hosts>/<node>/root, once `sim fault` made one), else its shape's host
as the node boots (`realspec.host_spec`, one per shape, built once). The trees' GPUs already sit
on vfio-pci, so the vfio pass finds nothing to move; a write it would still make is recorded, not
applied (there is no kernel behind these trees).

When: once per pod (a new pod on the node, e.g. after a rollout, runs again). Not played: the
probe's later rounds every `--interval` seconds (the trees do not change under a running probe
except through `sim fault`, which the health agent follows, not the probe).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from lightkube import AsyncClient

from gpu_operator.node.cluster.kubeapi import KubeNodeView
from gpu_operator.node.cluster.publish import publish_once
from gpu_operator.node.host.hostfs import HostFS, RecordingWriter
from gpu_operator.node.vfio.incluster import reconcile
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.hardware.faults import NodeHosts
from gpu_operator.sim.realnode.realspec import host_spec
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.vocabulary import NODE_AGENT_FIELD_MANAGER

log = logging.getLogger("gpu_operator.sim.standins")

PROBE_APP = "nvidia-gpu-probe"
VFIO_APP = "nvidia-vfio-manager"
DEFAULT_WORKLOAD_FLAG = "--default-workload="


class ShapeTrees:
    """Each shape's host tree as the node boots, built once under `base` (a temporary directory
    of its own when None); a node `sim fault` gave a tree of its own reads that one."""

    def __init__(self, hosts: Path | None) -> None:
        self.hosts = NodeHosts(hosts) if hosts is not None else None
        self.base = (
            Path(hosts) / ".boot"
            if hosts is not None
            else Path(tempfile.mkdtemp(prefix="gpu-operator-sim-boot-"))
        )
        self.built: dict[str, Path] = {}

    def root(self, node: str, shape: str) -> Path:
        if self.hosts is not None and self.hosts.has(node):
            return self.hosts.root(node)
        if shape not in self.built:
            root = self.base / shape
            shutil.rmtree(root, ignore_errors=True)
            hosttree.build(host_spec(shape), root)
            self.built[shape] = root
        return self.built[shape]


def pod_to_play(
    done: dict[str, str], node: str, view: StandinNodeView | None, pods: list[PodView]
) -> PodView | None:
    """The newest running pod on a kwok node whose pass has not run (`done`: node -> that pod's uid);
    None when it ran, or when none runs (then the node is forgotten: a later pod runs again)."""
    running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
    if view is None or view.shape is None or not running:
        done.pop(node, None)
        return None
    pod = running[-1]
    return None if done.get(node) == pod.uid else pod


class _OncePerPod:
    """A node agent played once per pod on each kwok node where its pod runs (a `podwatch.Player`)."""

    app = ""
    field_manager = NODE_AGENT_FIELD_MANAGER
    identity = ident.POD  # its pod's ServiceAccount, for the agent's own (sync) client
    identities: Any = None  # given by NodeStandIns (without: `client`, one for all pods)

    def __init__(self, trees: ShapeTrees, config: Any = None, client: Any = None) -> None:
        from lightkube import Client

        self.trees = trees
        # the agents' own code takes a (sync) client, writing as the node agents' field manager
        self.client = client if client is not None else Client(config, field_manager=NODE_AGENT_FIELD_MANAGER)
        self.done: dict[str, str] = {}  # node -> uid of the pod whose pass ran

    async def start(self, client: AsyncClient) -> None:
        return None

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        pod = pod_to_play(self.done, node, view, pods)
        if pod is None or view is None or view.shape is None:
            return None
        fs = HostFS(self.trees.root(node, view.shape.name))
        own = (
            self.client
            if self.identities is None
            else await self.identities.sync_for_pod(pod, self.field_manager)
        )
        await asyncio.to_thread(self.run, fs, node, pod, own)
        self.done[node] = pod.uid
        return None

    def run(self, fs: HostFS, node: str, pod: PodView, client: Any) -> None:
        raise NotImplementedError


class ProbeStandIn(_OncePerPod):
    """Our GPU probe's publish step where its pod runs."""

    app = PROBE_APP

    def run(self, fs: HostFS, node: str, pod: PodView, client: Any) -> None:
        default = next(
            (a.removeprefix(DEFAULT_WORKLOAD_FLAG) for a in pod.argv if a.startswith(DEFAULT_WORKLOAD_FLAG)),
            None,
        )
        codes, _ = publish_once(
            fs,
            KubeNodeView(
                node,
                pod.namespace,
                pod_name=pod.name,
                client=client,
                component="gpu-operator-node-probe",
            ),
            default_workload=default,
        )
        log.info(
            "node %s: GPU probe (pod %s) published its facts; findings: %s",
            node,
            pod.name,
            ", ".join(sorted(codes)) or "none",
        )


class VfioManagerStandIn(_OncePerPod):
    """Our vfio manager's reconcile pass where its pod runs."""

    app = VFIO_APP

    def run(self, fs: HostFS, node: str, pod: PodView, client: Any) -> None:
        writer = RecordingWriter()
        record, wrote = reconcile(
            fs,
            writer,
            KubeNodeView(
                node,
                pod.namespace,
                pod_name=pod.name,
                client=client,
                component="gpu-operator-vfio-manager",
            ),
        )
        log.info(
            "node %s: vfio manager (pod %s) reconciled: state %s%s",
            node,
            pod.name,
            record.get("state", "?"),
            "" if wrote else " (Node unchanged)",
        )


def node_agents(config: Any, hosts: Path | None) -> list[_OncePerPod]:
    """The probe and the vfio manager, sharing the shapes' boot trees and one node-agent client."""
    from lightkube import Client

    trees, client = ShapeTrees(hosts), Client(config, field_manager=NODE_AGENT_FIELD_MANAGER)
    return [ProbeStandIn(trees, client=client), VfioManagerStandIn(trees, client=client)]
