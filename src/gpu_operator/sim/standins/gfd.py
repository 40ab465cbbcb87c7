"""What NVIDIA's GPU feature discovery (GFD) does to the API for a kwok node, which runs no
container: once GFD's pod (label app=gpu-feature-discovery, the operator's DaemonSet) runs on a
node, the NodeFeature object GFD v0.20.0 publishes there, with the labels GFD derives for the
node's GPUs (`Shape.gfd_labels`). GFD writes nothing else: NFD's master (or, without NFD, the
operator) puts those labels on the Node.

Facts (NVIDIA/k8s-device-plugin v0.20.0, read for facts only):
- internal/lm/output.go: NodeFeature nfd.k8s-sigs.io/v1alpha1 named `nvidia-features-for-<node>`
  in the pod's namespace (NAMESPACE), labelled `nfd.node.kubernetes.io/node-name: <node>`, owned
  by the pod's DaemonSet (controller: true) and the pod itself (POD_NAME looked up; a pod without a
  DaemonSet owner gives no owner references); spec `features` empty (flags, attributes,
  instances), `labels` the labels. Get, then create, or update only when labels, owner
  references or spec differ. GFD never deletes it: the garbage collector does, once the
  DaemonSet and the pod are both gone.
- cmd/gpu-feature-discovery/main.go: the NodeFeature API is on by default; MIG_STRATEGY (or
  GFD_MIG_STRATEGY) picks the MIG strategy (default none); GFD_NO_TIMESTAMP drops
  `nvidia.com/gfd.timestamp`, which is taken once per process start.

Played: the labels of full GPUs (see `Shape.gfd_labels`) and, once the MIG manager's stand-in has
changed the GPUs (`sim/hardware/mighw.py`), GFD's MIG labels per strategy (`sim/standins/migresources.py`), the
timestamp as the pod's start time, the MIG strategy from the pod's environment, the owner
references, and sharing (time-slicing/MPS: `sim/standins/sharing.py`) from the plugin config its pod's
config-manager holds (`sim/standins/pluginconfig.py`; a label change is the sidecar's SIGHUP: GFD labels
afresh; a config GFD refuses: it exits and writes nothing). Not played: the 60 s relabel loop
(the GPUs change only while the MIG manager has paused GFD: its new pod labels them afresh), file
output (features.d).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource

from gpu_operator.sim.hardware.mighw import MigHardware
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins import migresources, sharing
from gpu_operator.sim.standins.pluginconfig import PluginConfigs, volume_reader
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.vocabulary import (
    GFD_NODE_FEATURE_PREFIX,
    NFD_NODE_NAME_LABEL,
    NODE_FEATURE_GROUP,
    NODE_FEATURE_PLURAL,
    NODE_FEATURE_VERSION,
)

log = logging.getLogger("gpu_operator.sim.standins.gfd")

APP = "gpu-feature-discovery"
# client-go's default field manager: the binary's name (its user agent's prefix)
FIELD_MANAGER = "gpu-feature-discovery"
NodeFeature = create_namespaced_resource(
    NODE_FEATURE_GROUP, NODE_FEATURE_VERSION, "NodeFeature", NODE_FEATURE_PLURAL
)
API_VERSION = f"{NODE_FEATURE_GROUP}/{NODE_FEATURE_VERSION}"


def mig_strategy(env: dict[str, str]) -> str:
    """GFD's --mig-strategy from its environment (GFD_MIG_STRATEGY first, then MIG_STRATEGY)."""
    return env.get("GFD_MIG_STRATEGY") or env.get("MIG_STRATEGY") or "none"


def no_timestamp(env: dict[str, str]) -> bool:
    return env.get("GFD_NO_TIMESTAMP", "").lower() in ("1", "t", "true")


def owner_references(pod: PodView) -> list[dict[str, Any]]:
    """The pod's DaemonSet (controller) and the pod; none for a pod no DaemonSet owns."""
    if pod.daemonset is None:
        return []
    return [
        {**pod.daemonset, "controller": True},
        {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid},
    ]


def labels_for(
    view: StandinNodeView,
    pod: PodView,
    hardware: MigHardware | None = None,
    config: sharing.Sharing | None = None,
) -> dict[str, str]:
    """The labels GFD's process in `pod` derives on the node (none where NVML sees no GPU), with the
    GPUs' MIG state as `hardware` has it (without: every GPU with MIG off) and the sharing of the
    plugin `config` it holds (without: none)."""
    if view.shape is None or not view.nvidia_gpus:
        return {}
    config = config or sharing.Sharing()
    stamp = None if no_timestamp(pod.env) else pod.started
    strategy = mig_strategy(pod.env) if mig_strategy(pod.env) != "none" else (config.mig_strategy or "none")
    if hardware is None:
        return sharing.gfd_labels(config, view.shape.gfd_labels(strategy, stamp, view.name), False)
    gpus = hardware.gpus(view.name, view.shape)
    labels = migresources.gfd_labels(view.shape, strategy, gpus, stamp, view.name)
    return sharing.gfd_labels(config, labels, any(g.enabled for g in gpus))


def node_feature(node: str, pod: PodView, labels: dict[str, str]) -> dict[str, Any]:
    """The NodeFeature GFD's pod on `node` publishes."""
    metadata: dict[str, Any] = {
        "name": f"{GFD_NODE_FEATURE_PREFIX}{node}",
        "namespace": pod.namespace,
        "labels": {NFD_NODE_NAME_LABEL: node},
    }
    refs = owner_references(pod)
    if refs:
        metadata["ownerReferences"] = refs
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeFeature",
        "metadata": metadata,
        "spec": {"features": {"flags": {}, "attributes": {}, "instances": {}}, "labels": dict(labels)},
    }


def differs(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """What GFD compares before an update: the object's labels, owner references and spec (an
    empty `features` equals an empty one however the CRD's schema stored it)."""
    meta, want = current.get("metadata") or {}, desired["metadata"]
    spec = current.get("spec") or {}
    return bool(
        (meta.get("labels") or {}) != want["labels"]
        or (meta.get("ownerReferences") or []) != want.get("ownerReferences", [])
        or (spec.get("labels") or {}) != desired["spec"]["labels"]
        or any(v for v in (spec.get("features") or {}).values())
    )


async def publish(client: AsyncClient, body: dict[str, Any]) -> str:
    """Get, then create or update only when different; returns what it did."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    try:
        found = await client.get(NodeFeature, name, namespace=namespace)
        current: dict[str, Any] = found.to_dict()  # type: ignore[no-untyped-call]
    except ApiError as err:
        if err.status.code != 404:
            raise
        await client.create(from_dict(body), field_manager=FIELD_MANAGER)
        return "created"
    if not differs(current, body):
        return "unchanged"
    updated = {
        **current,
        "metadata": {**current["metadata"], "labels": body["metadata"]["labels"]},
        "spec": body["spec"],
    }
    updated["metadata"].pop("ownerReferences", None)
    if body["metadata"].get("ownerReferences"):
        updated["metadata"]["ownerReferences"] = body["metadata"]["ownerReferences"]
    await client.replace(from_dict(updated), field_manager=FIELD_MANAGER)
    return "updated"


class FeatureDiscovery:
    """The GFD stand-in (a `podwatch.Player`): one NodeFeature per namespace whose GFD pod runs on
    a kwok node; rewritten only when its body changes (a new pod, another MIG strategy)."""

    app = APP
    field_manager = FIELD_MANAGER
    identity = ident.POD  # its pod's ServiceAccount: the NodeFeature, the config-manager's label read
    identities: Any = None  # given by NodeStandIns: the kubelet reads the config ConfigMap's volume

    def __init__(self, hardware: MigHardware | None = None, configs: PluginConfigs | None = None) -> None:
        self.written: dict[tuple[str, str], dict[str, Any]] = {}
        self.hardware = hardware
        self.configs = configs or PluginConfigs()
        self.on_nodes: set[str] = set()  # nodes where a GFD pod runs
        self.wake: Callable[[str], None] = lambda _node: None

    def attach(self, wake: Callable[[str], None]) -> None:
        self.wake = wake
        self.configs.subscribe(lambda node: self.wake(node) if node in self.on_nodes else None)

    async def start(self, client: AsyncClient) -> None:
        await self.configs.start(client)

    async def sync(
        self, client: AsyncClient, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        if view is None or view.shape is None:
            return None
        newest: dict[str, PodView] = {}
        for pod in sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name)):
            newest[pod.namespace] = pod  # one GFD per node and namespace; the newest wins
        (self.on_nodes.add if newest else self.on_nodes.discard)(node)
        if not newest:
            self.configs.forget(APP, node)
        for pod in newest.values():
            try:
                config = await self.configs.config(client, node, pod, volume_reader(self.identities, node))
            except sharing.SharingConfigError as err:
                log.info("node %s: GFD's pod %s/%s does not start: %s", node, pod.namespace, pod.name, err)
                continue
            labels = labels_for(view, pod, self.hardware, config)
            if not labels:
                continue  # NVML finds no GPU: GFD fails at start and writes nothing
            body = node_feature(node, pod, labels)
            key = (pod.namespace, body["metadata"]["name"])
            if self.written.get(key) == body:
                continue
            done = await publish(client, body)
            self.written[key] = body
            if done != "unchanged":
                log.info(
                    "node %s: GFD's pod %s/%s runs: NodeFeature %s/%s %s",
                    node,
                    pod.namespace,
                    pod.name,
                    pod.namespace,
                    key[1],
                    done,
                )
        return None
