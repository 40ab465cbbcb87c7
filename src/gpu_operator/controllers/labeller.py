"""The node-labelling controller's I/O: patch the nodes whose labels differ, with bounded concurrency."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lightkube.core.exceptions import ApiError

from gpu_operator.controllers.cache import NodeView
from gpu_operator.controllers.nodelabels import LabelPolicy, NodeDriver, desired_change
from gpu_operator.kube.client import Kube

log = logging.getLogger("gpu_operator.nodelabels")


@dataclass
class LabelReport:
    patched: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class NodeLabeller:
    def __init__(self, kube: Kube, concurrency: int = 32) -> None:
        self.kube = kube
        self.concurrency = concurrency

    async def label(self, nodes: Iterable[NodeView], policy: LabelPolicy,
                    drivers: Mapping[str, NodeDriver] | None = None) -> LabelReport:
        """Patch every node whose labels differ from what the policy (and, with NVIDIADrivers,
        the node's owner) wants; nodes that already match cost nothing (no request)."""
        report = LabelReport()
        drivers = drivers or {}
        changes = [(node, desired_change(node.labels, node.annotations, policy, drivers.get(node.name)))
                   for node in nodes]
        changes = [(node, change) for node, change in changes if change]
        if not changes:
            return report
        limit = asyncio.Semaphore(self.concurrency)

        async def patch(node: NodeView, patch_body: dict[str, object]) -> None:
            async with limit:
                try:
                    await self.kube.merge_patch("v1", "Node", node.name, patch_body)
                except ApiError as err:
                    if err.status.code == 404:
                        return  # the node left meanwhile
                    report.failed[node.name] = str(err.status.message)
                    log.warning("node %s: label patch failed: %s", node.name, err.status.message)
                    return
                report.patched.append(node.name)

        await asyncio.gather(*(patch(node, change.merge_patch()) for node, change in changes))
        for node, change in changes:
            if node.name in report.patched:
                log.info("node %s: labels %s", node.name, _describe(change.labels, change.annotations))
        return report


def _describe(labels: dict[str, str | None], annotations: dict[str, str | None]) -> str:
    parts = [f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted({**labels, **annotations}.items())]
    return ", ".join(parts)
