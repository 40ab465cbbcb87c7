"""The kubelet plugin's `compute-domains` container of NVIDIA's DRA driver on kwok nodes
(`ChannelPlugin`, run by `sim/standins/draplugin.py`'s stand-in while the plugin's pod runs with that
container): a ResourceSlice of driver compute-domain.nvidia.com, pool = the node, with `channel-0`
and `daemon-0` (attributes type and id); when a channel claim allocated on its node is prepared (the
claim's pod bound there), the node labelled `resource.nvidia.com/computeDomain=<uid>` (refused when
it carries another domain's label, as NVIDIA's plugin refuses), so the DaemonSet's pod lands there;
the label taken back once no channel claim of that domain is left on the node.

The controller and the IMEX daemons, the driver's names and the sources: sim/standins/computedomain.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from gpu_operator.kube.resources import ComputeDomainResource
from gpu_operator.sim.standins.computedomain import (
    DOMAIN_LABEL,
    DRIVER,
    POLL,
    ResourceClaim,
    ResourceSlice,
    as_dict,
    create_if_absent,
)
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView

log = logging.getLogger(
    "gpu_operator.sim.standins.computedomain"
)  # the stand-in's one logger, as before the split

CONTAINER = "compute-domains"  # the kubelet plugin pod's container
OWNER_LABEL = "gpu-operator.sim/compute-domain-plugin"  # the slices this stand-in published (its restarts)


def devices() -> list[dict[str, Any]]:
    """What the plugin publishes: channel 0 (the others are not advertised) and daemon 0."""
    return [
        {"name": f"{kind}-0", "attributes": {"type": {"string": kind}, "id": {"int": 0}}}
        for kind in ("channel", "daemon")
    ]


class ChannelPlugin:
    """The kubelet plugin's `compute-domains` container on one node (called by `sim/standins/draplugin.py`'s
    stand-in with its pod's client)."""

    def __init__(self) -> None:
        self.published: set[str] = set()
        self.labelled: set[str] = set()  # nodes it labelled with a domain
        # the cluster's ResourceClaims, listed at most once a POLL for all nodes (the same read every
        # plugin pod's ServiceAccount may make): 5,000 nodes do not list them 5,000 times a second
        self.claims: tuple[float, list[dict[str, Any]]] = (-POLL, [])

    async def start(self, client: Any) -> list[str]:
        """The nodes of the slices it published before (a restart of the stand-ins): looked at again
        (withdrawn where the plugin's pod is gone)."""
        nodes = [
            str(found.spec["nodeName"])
            async for found in client.list(ResourceSlice, labels={OWNER_LABEL: "true"})
            if found.spec and found.spec.get("nodeName") and found.spec.get("driver") == DRIVER
        ]
        self.published.update(nodes)
        return nodes

    @staticmethod
    def slice_name(node: str) -> str:
        return f"{node}-{DRIVER}"

    def body(self, view: StandinNodeView) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": self.slice_name(view.name),
                "labels": {OWNER_LABEL: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": view.name,
                        "uid": view.uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": DRIVER,
                "nodeName": view.name,
                "pool": {"name": view.name, "generation": 1, "resourceSliceCount": 1},
                "devices": devices(),
            },
        }

    async def sync(self, client: Any, view: StandinNodeView, pod: PodView | None) -> float | None:
        """`pod`: the plugin's running pod (None: gone, withdraw)."""
        node = view.name
        if pod is None or CONTAINER not in pod.containers:
            if node in self.published:
                try:
                    await client.delete(ResourceSlice, self.slice_name(node))
                except ApiError as err:
                    if err.status.code != 404:
                        raise
                self.published.discard(node)
                log.info(
                    "node %s: the compute-domain kubelet plugin is gone: its ResourceSlice withdrawn", node
                )
            return None
        if node not in self.published:
            await create_if_absent(client, self.body(view))
            self.published.add(node)
            log.info(
                "node %s: the compute-domain kubelet plugin runs: ResourceSlice %s published",
                node,
                self.slice_name(node),
            )
        await self.prepare(client, node)
        return POLL

    async def prepare(self, client: Any, node: str) -> None:
        """The channel claims allocated on this node whose pods are bound here: the node labelled
        with their domain; the label taken back once none is left."""
        wanted: set[str] = set()
        listed, claims = self.claims
        if time.monotonic() - listed >= POLL:
            claims = [as_dict(found) async for found in client.list(ResourceClaim, namespace="*")]
            self.claims = (time.monotonic(), claims)
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            results = (allocation.get("devices") or {}).get("results") or []
            if not any(
                r.get("driver") == DRIVER
                and r.get("pool") == node
                and str(r.get("device", "")).startswith("channel-")
                for r in results
            ):
                continue
            if not (claim.get("status") or {}).get("reservedFor"):
                continue
            for config in (allocation.get("devices") or {}).get("config") or []:
                params = (config.get("opaque") or {}).get("parameters") or {}
                if (
                    (config.get("opaque") or {}).get("driver") == DRIVER
                    and params.get("kind") == "ComputeDomainChannelConfig"
                    and await self._same_namespace(client, claim, params)
                ):
                    wanted.add(str(params.get("domainID")))
        if not wanted and node not in self.labelled:
            return
        current = await client.get(Node, node)
        labels = dict(current.metadata.labels or {})
        have = labels.get(DOMAIN_LABEL)
        if have and have not in wanted:
            labels.pop(DOMAIN_LABEL)
        elif not have and wanted:
            if len(wanted) > 1:
                log.info(
                    "node %s: channel claims of %d ComputeDomains: label already exists for a different "
                    "ComputeDomain",
                    node,
                    len(wanted),
                )
            labels[DOMAIN_LABEL] = sorted(wanted)[0]
        elif have and len(wanted) > 1:
            log.info("node %s: label already exists for a different ComputeDomain (%s)", node, have)
            return
        else:
            return
        current.metadata.labels = labels
        await client.replace(current)  # an update, as NVIDIA's plugin makes it
        (self.labelled.add if DOMAIN_LABEL in labels else self.labelled.discard)(node)
        log.info("node %s: label %s=%s", node, DOMAIN_LABEL, labels.get(DOMAIN_LABEL, "(removed)"))

    async def _same_namespace(self, client: Any, claim: dict[str, Any], params: dict[str, Any]) -> bool:
        """NVIDIA's plugin refuses a channel claim outside its ComputeDomain's namespace."""
        namespace = claim["metadata"]["namespace"]
        async for cd in client.list(ComputeDomainResource, namespace=namespace):
            if as_dict(cd)["metadata"]["uid"] == params.get("domainID"):
                return True
        log.info(
            "ResourceClaim %s/%s: the ResourceClaim's namespace is different than the ComputeDomain's "
            "namespace",
            namespace,
            claim["metadata"]["name"],
        )
        return False
