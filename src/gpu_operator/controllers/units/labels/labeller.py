"""The node-labelling controller's I/O: patch the nodes whose labels differ, with bounded
concurrency; nodes whose patch failed are retried on their own backoff (`LabelRetries`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from lightkube.core.exceptions import ApiError

from gpu_operator.controllers import metrics
from gpu_operator.controllers.pacing import AdaptiveGate, AdaptiveLimit
from gpu_operator.controllers.queries import NodeDriver
from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.units.labels.gfdlabels import mirrored
from gpu_operator.controllers.units.labels.nodelabels import (
    LabelPolicy,
    NodeChange,
    desired_change,
)
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import GFD_LABELS_ANNOTATION

log = logging.getLogger("gpu_operator.nodelabels")


@dataclass(frozen=True)
class LabelFailure:
    """Why one node's label patch failed: the HTTP status code and the apiserver's message."""

    code: int
    message: str

    def __str__(self) -> str:
        return f"HTTP {self.code}: {self.message}"


@dataclass
class LabelReport:
    patched: list[str] = field(default_factory=list)
    failed: dict[str, LabelFailure] = field(default_factory=dict)


class LabelRetries:
    """Per-node backoff for label patches that keep failing (a 403 from a policy webhook, say).

    A failed node is retried alone, after `backoff.delay(n)` for its n-th consecutive failure; it
    does not wake the other loops. Each failure is counted in
    `gpu_operator_node_label_patch_failures_total{code}`; the warning is logged once per node
    (again only when the reason changes), and once more when the node is labelled at last."""

    def __init__(self, backoff: Backoff, clock: Callable[[], float] = time.monotonic) -> None:
        self.backoff = backoff
        self.clock = clock
        self.failures: dict[str, tuple[int, LabelFailure]] = {}
        self.scheduled: dict[str, float] = {}

    def record(self, report: LabelReport) -> None:
        now = self.clock()
        for name in report.patched:
            self.scheduled.pop(name, None)
            if (previous := self.failures.pop(name, None)) is not None:
                log.info("node %s: labels patched after %d failed attempts", name, previous[0])
        for name, failure in report.failed.items():
            metrics.LABEL_PATCH_FAILURES.labels(str(failure.code)).inc()
            count, reason = self.failures.get(name, (0, None))
            delay = self.backoff.delay(count + 1)
            if reason != failure:
                log.warning(
                    "node %s: label patch failed (%s); retrying this node with backoff "
                    "(%.0f s, doubling up to %.0f s); logged again only if the reason changes",
                    name,
                    failure,
                    delay,
                    self.backoff.cap,
                )
            self.failures[name] = (count + 1, failure)
            self.scheduled[name] = now + delay

    def forget(self, name: str) -> None:
        """The node is gone."""
        self.failures.pop(name, None)
        self.scheduled.pop(name, None)

    def due(self) -> set[str]:
        """Nodes whose retry time has come (handed out once; a new failure schedules them again)."""
        now = self.clock()
        ready = {name for name, at in self.scheduled.items() if at <= now}
        for name in ready:
            del self.scheduled[name]
        return ready

    def next_wait(self) -> float | None:
        """Seconds until the next scheduled retry; None when none is scheduled."""
        if not self.scheduled:
            return None
        return max(0.0, min(self.scheduled.values()) - self.clock())


class NodeLabeller:
    """Patches go through one adaptive gate kept across passes (controllers/pacing.py): up to
    `concurrency` in flight, fewer while the apiserver answers slowly, 429 or 5xx."""

    def __init__(self, kube: Kube, concurrency: int = 32) -> None:
        self.kube = kube
        self.concurrency = concurrency
        # The whole bound to start (the apiserver is measured at it); a latency rise alone never
        # goes below half of it, overload (429, 5xx) may (see pacing).
        self.gate = AdaptiveGate(
            AdaptiveLimit(initial=concurrency, maximum=concurrency, floor=max(1, concurrency // 2)),
            on_change=metrics.LABEL_CONCURRENCY.set,
        )
        metrics.LABEL_CONCURRENCY.set(self.gate.limit.allowed)
        # node -> the inputs of its last look that found nothing to change: `desired_change` is pure,
        # so the same inputs again (a driver pod's status, another unit's condition or annotation
        # changed the view, not what labelling reads) need no second look
        self._settled: dict[str, tuple[object, ...]] = {}
        self._widest = 0  # the most nodes one pass was handed (bounds `_settled`: gone nodes' entries)
        self.looked = 0  # `desired_change` calls made (for tests)

    async def label(
        self,
        nodes: Iterable[NodeView],
        policy: LabelPolicy,
        drivers: Mapping[str, NodeDriver] | None = None,
        events: bool = False,
        gfd: Callable[[str], Mapping[str, str] | None] = lambda _name: None,
    ) -> LabelReport:
        """Patch every node whose labels differ from what the policy (and, with NVIDIADrivers,
        the node's owner) wants; nodes that already match cost nothing (no request). Waits for
        all of them. `events`: these nodes are here for their own watch events, so how long each
        waited since its view arrived is measured (not for a new policy). `gfd`: the labels GPU
        feature discovery publishes for a node (controllers/units/labels/gfdlabels.py), None if none.

        As many workers as the gate's bound take the nodes one by one: the first patch leaves as
        soon as its own node's change is known, not after the whole fleet's (a new policy's pass
        over 1,000 nodes computed 44 ms of changes before its first patch), and a pass holds that
        many tasks, not one per node."""
        report = LabelReport()
        drivers = drivers or {}
        todo = list(nodes)
        pending = iter(todo)
        self._widest = max(self._widest, len(todo))
        if len(self._settled) > 2 * self._widest + 1024:
            self._settled.clear()
        settled = self._settled

        async def worker() -> None:
            for node in pending:  # shared: each node goes to one worker
                driver, published = drivers.get(node.name), gfd(node.name)
                inputs = (node.labels, node.annotations, policy, driver, published, node.facts.toolkit_group)
                if settled.get(node.name) == inputs:
                    continue
                self.looked += 1
                change = desired_change(
                    node.labels, node.annotations, policy, driver, node.name, published, inputs[5]
                )
                if change:
                    settled.pop(node.name, None)
                    await self._patch(node, change, report, node.seen if events else None)
                else:
                    settled[node.name] = inputs

        workers = [asyncio.ensure_future(worker()) for _ in range(min(self.concurrency, len(todo)))]
        try:
            await asyncio.gather(*workers)
        finally:  # an error (or our own cancellation) stops the other workers too
            for task in workers:
                task.cancel()
        return report

    async def _patch(
        self, node: NodeView, change: NodeChange, report: LabelReport, since: float | None
    ) -> None:
        """One node's merge patch through the gate, its outcome into `report`; a node gone
        meanwhile (404) is neither patched nor failed."""
        async with self.gate.slot() as outcome:
            if since:
                metrics.LABEL_DELAY.observe(time.monotonic() - since)
            try:
                await self.kube.merge_patch("v1", "Node", node.name, change.merge_patch())
            except ApiError as err:
                outcome[0] = int(err.status.code or 0)
                if err.status.code != 404:
                    report.failed[node.name] = LabelFailure(
                        int(err.status.code or 0), str(err.status.message)
                    )
                return
        report.patched.append(node.name)
        log.info("node %s: labels %s", node.name, _describe(change.labels, change.annotations))


# GFD's labels that say what the node is; the rest of its set is counted, not listed, in the log.
_GFD_SHOWN = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/mig.capable")


def _describe(labels: dict[str, str | None], annotations: dict[str, str | None]) -> str:
    """The change for the log: the operator's own keys one by one; GFD's mirrored labels (about 25 a
    node) as a count with the few that say what the node is."""
    # (a change of GFD's set carries the annotation that lists it; one value changing is shown as is)
    gfd = (
        {k for k, v in labels.items() if mirrored(k, v or "x")}
        if GFD_LABELS_ANNOTATION in annotations
        else set()
    )
    parts = [
        f"{k}={v}" if v is not None else f"-{k}"
        for k, v in sorted({**labels, **annotations}.items())
        if k not in gfd and k != GFD_LABELS_ANNOTATION
    ]
    if gfd:
        added = sorted(k for k in gfd if labels[k] is not None)
        shown = ", ".join(f"{k}={labels[k]}" for k in _GFD_SHOWN if k in added)
        removed = len(gfd) - len(added)
        parts.append(
            f"GPU feature discovery's labels: {len(added)} set"
            + (f" ({shown})" if shown else "")
            + (f", {removed} removed" if removed else "")
        )
    return ", ".join(parts)
