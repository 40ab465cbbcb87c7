"""The node-labelling loop: one writer of node labels for both stacks.

Which stack a GPU node gets follows which CR is there: a ClusterPolicy -> the device-plugin label
set (by workload config), a GPUCluster -> the DRA label set. Both at once -> no label is touched
(both CRs report the conflict). Neither (the last one was deleted) -> our labels are taken back.
Leaving the DRA stack waits for claims: `nvidia.com/gpu.deploy.dra-driver` stays on a node while
a pod there holds a ResourceClaim allocated by gpu.nvidia.com (the kubelet plugin must unprepare
it), and the node is looked at again every `claim_recheck` seconds until it is released.

A node event is served at once: the loop does not wait for a batch of patches to finish before it
looks at the next dirty nodes (each patch is its own task through the labeller's gate), and a
pass costs what its dirty nodes cost, not the cluster's size. Events are coalesced only under
load: after a pass the loop waits up to twice as long as the pass took (at most `coalesce`) before
the next, so a storm of events is served in batches while a lone join is patched right away. A
node whose event arrives while its own patch is in flight is looked at again when that patch
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpu_operator.controllers.cache import DriverPodView, NodeView, PolicyView
from gpu_operator.controllers.cleanup import strip_nodes
from gpu_operator.controllers.clusterpolicy import active_policy
from gpu_operator.controllers.labeller import LabelFailure, LabelReport, LabelRetries, NodeLabeller
from gpu_operator.controllers.leader import log_pass_failure
from gpu_operator.controllers.nodelabels import LabelPolicy, NodeChange, NodeDriver
from gpu_operator.controllers.nvidiadriver import node_drivers
from gpu_operator.controllers.nvidiadriver import parse as parse_drivers
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import DRA_DRIVER_LABEL

log = logging.getLogger("gpu_operator.operator")

GPU_DRIVER = "gpu.nvidia.com"


@dataclass
class Sources:
    """What the loop reads from the operator's caches."""

    nodes: Callable[[], list[NodeView]]
    node: Callable[[str], NodeView | None]
    policies: Callable[[], list[PolicyView]]
    clusters: Callable[[], list[PolicyView]]
    drivers: Callable[[], list[PolicyView]]
    driver_pods: Callable[[], list[DriverPodView]]


def claim_holding_nodes(claims: list[dict[str, Any]]) -> frozenset[str]:
    """Nodes where an allocated, reserved ResourceClaim holds a device of gpu.nvidia.com (the
    allocation's pool is the node whose ResourceSlices offered it)."""
    nodes = set()
    for claim in claims:
        status = claim.get("status") or {}
        if not status.get("reservedFor"):
            continue
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            if result.get("driver") == GPU_DRIVER and result.get("pool"):
                nodes.add(result["pool"])
    return frozenset(nodes)


class LabelLoop:
    def __init__(self, kube: Kube, settings: OperatorSettings, sources: Sources, kick: asyncio.Event,
                 dirty: Callable[[], set[str]], take_dirty: Callable[[], set[str]]) -> None:
        self.kube = kube
        self.settings = settings
        self.sources = sources
        self.kick = kick
        self.dirty = dirty
        self.take_dirty = take_dirty
        self.labeller = NodeLabeller(kube, concurrency=settings.label_concurrency)
        self.retries = LabelRetries(settings.label_backoff)
        self.policy: LabelPolicy | None = None
        self.drivers: dict[str, NodeDriver] | None = None
        self._source: PolicyView | None = None
        self._spec_policy: LabelPolicy | None = None
        # nodes whose DRA driver label outlived the last CR: a pod there still holds a GPU claim
        self._held: set[str] = set()
        # under a ClusterPolicy, the claim holders of the last ResourceClaim list and when it was
        # taken: listed again at most every `claim_recheck` seconds, not on every labelling pass
        self._holders_seen: tuple[float, frozenset[str]] | None = None
        # one task per node whose patch is in flight; nodes that changed meanwhile, to look at again
        self._inflight: dict[str, tuple[asyncio.Task[None], NodeView]] = {}
        self._recheck: set[str] = set()

    def _node_drivers(self, policy: LabelPolicy) -> dict[str, NodeDriver] | None:
        if not policy.use_nvidia_driver_crd:
            return None
        drivers, _ = parse_drivers(self.sources.drivers())
        return node_drivers(drivers.values(), self.sources.nodes(), self.sources.driver_pods())

    def _wanted(self) -> LabelPolicy | None | Literal[False]:
        """The policy to label by; None: nothing to label by now; False: take our labels back."""
        active = active_policy(self.sources.policies())
        clusters = self.sources.clusters()
        if active is not None and clusters:
            return None  # both: no label flips (both CRs say why in their status)
        if clusters:
            self._source = None
            # NVIDIADrivers own the DRA stack's driver when there are any (owner labels, upgrades)
            valid, _ = parse_drivers(self.sources.drivers())
            return LabelPolicy(dra=True, use_nvidia_driver_crd=bool(valid))
        if active is None:
            return False if self._source is not None or (self.policy is not None and self.policy.dra) else None
        if self._source is not active:  # validated once per ClusterPolicy version
            self._source = active
            model = active.as_policy.model  # parsed once per version (controllers/cache.py)
            self._spec_policy = LabelPolicy.of(model.spec) if model is not None else None
        return self._spec_policy or (self.policy if self.policy is not None and not self.policy.dra else None)

    async def _holders(self, views: list[NodeView]) -> frozenset[str]:
        """Nodes carrying the DRA driver label where a pod holds a gpu.nvidia.com claim (one list of
        ResourceClaims, only while some node carries the label)."""
        labelled = {v.name for v in views if DRA_DRIVER_LABEL in v.labels}
        if not labelled:
            return frozenset()
        claims = await self.kube.list_dicts("resource.k8s.io/v1", "ResourceClaim", namespace="*")  # every namespace
        return claim_holding_nodes(claims) & labelled

    async def _claims(self, policy: LabelPolicy) -> LabelPolicy:
        """Leaving the DRA stack: the nodes that keep the DRA driver label for now. The claims are
        listed at most every `claim_recheck` seconds (the DRA plugin is gone, so no new claim is
        allocated there; a release is noticed within that time, as when no CR is left)."""
        if policy.dra:
            self._holders_seen = None
            return policy
        now = time.monotonic()
        if self._holders_seen is None or now - self._holders_seen[0] >= self.settings.claim_recheck:
            self._holders_seen = (now, await self._holders(self.sources.nodes()))
        holders = frozenset(name for name in self._holders_seen[1]
                            if (v := self.sources.node(name)) is not None and DRA_DRIVER_LABEL in v.labels)
        return replace(policy, claim_holders=holders)

    async def run(self, ready: Callable[[], Any]) -> None:
        await ready()
        try:
            await self._serve()
        finally:
            for task, _ in self._inflight.values():
                task.cancel()

    async def _serve(self) -> None:
        failures = 0
        quiet_from = 0.0  # the next pass starts no earlier than this (coalescing under load)
        while True:
            wait = self.retries.next_wait()
            if self._held or (self.policy is not None and self.policy.claim_holders):
                wait = min(wait if wait is not None else self.settings.claim_recheck, self.settings.claim_recheck)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout=wait)
            if (pause := quiet_from - time.monotonic()) > 0:
                await asyncio.sleep(pause)
            self.kick.clear()
            started = time.monotonic()
            self.dirty().update(self.retries.due())
            wanted = self._wanted()
            if wanted is False:
                await self._drain()
                await self._take_back()
                continue
            if wanted is None:
                await self._release_held()
                continue
            self._held = set()  # a CR is back: its labelling pass decides these nodes' labels
            try:
                policy = await self._claims(wanted)
                per_node = self._node_drivers(policy)
                if policy != self.policy or per_node != self.drivers:
                    # a new policy, stack or NVIDIADriver routing: every node is looked at (cheap
                    # when unchanged)
                    self.policy, self.drivers = policy, per_node
                    self.take_dirty()
                    self._dispatch(self.sources.nodes(), policy, per_node, events=False)
                else:
                    self._dispatch([v for n in self.take_dirty() if (v := self.sources.node(n)) is not None],
                                   policy, per_node, events=True)
            except Exception as err:  # not one node's patch (those report on their own): retry them all
                failures += 1
                delay = self.settings.label_backoff.delay(failures)
                log_pass_failure(log, f"node labelling failed ({err})", failures, delay)
                self.dirty().update(v.name for v in self.sources.nodes())
                await asyncio.sleep(delay)
                self.kick.set()
                continue
            failures = 0
            quiet_from = time.monotonic() + min(self.settings.coalesce, 2 * (time.monotonic() - started))

    def _dispatch(self, views: list[NodeView], policy: LabelPolicy, per_node: dict[str, NodeDriver] | None,
                  events: bool) -> None:
        """Start a patch for each node whose labels differ; a node whose patch is still in flight
        is looked at again when it returns. `events`: these nodes are here for their own watch
        events (how long each waited is measured), not for a new policy."""
        idle = []
        for view in views:
            if (sent := self._inflight.get(view.name)) is None:
                idle.append(view)
            elif (view.labels, view.annotations) != (sent[1].labels, sent[1].annotations):
                # its labels changed meanwhile (our own patch's echo, or someone else): the answer
                # to this patch is not the last word; an event that leaves them (a status update)
                # does not change what the patch in flight sends
                self._recheck.add(view.name)
        for view, change in self.labeller.changes(idle, policy, per_node):
            task = asyncio.create_task(self._patch(view, change, view.seen if events else None),
                                       name=f"label {view.name}")
            self._inflight[view.name] = (task, view)

    async def _patch(self, view: NodeView, change: NodeChange, since: float | None) -> None:
        try:
            try:
                report = await self.labeller.patch(view, change, since=since)
            except Exception as err:  # no answer (connection, timeout): this node retries on its backoff
                report = LabelReport(failed={view.name: LabelFailure(0, f"{type(err).__name__}: {err}")})
            # A failed node waits for its own backoff and wakes no other loop; this loop is woken
            # only to take the new retry time into its wait.
            self.retries.record(report)
            if report.failed:
                self.kick.set()
        finally:
            del self._inflight[view.name]
            if view.name in self._recheck:
                self._recheck.discard(view.name)
                self.dirty().add(view.name)
                self.kick.set()

    async def _drain(self) -> None:
        """Wait for the patches in flight (before our labels are taken back)."""
        while self._inflight:
            await asyncio.gather(*(task for task, _ in self._inflight.values()), return_exceptions=True)

    async def _release_held(self) -> None:
        """Neither CR: the DRA driver label kept on claim-holding nodes goes once their claims are
        released (looked at every `claim_recheck` seconds)."""
        if not self._held:
            return
        try:
            holders = await self._holders([v for n in self._held if (v := self.sources.node(n)) is not None])
            released = self._held - holders
            if released:
                await strip_nodes(self.kube, only=released)
                log.info("node(s) %s: GPU claims released; the DRA driver label removed", ", ".join(sorted(released)))
            self._held -= released
        except Exception as err:  # retried at the next recheck
            log.warning("releasing the DRA driver label of %s failed: %s", ", ".join(sorted(self._held)), err)

    async def _take_back(self) -> None:
        """Remove the labels and annotations we wrote from every node (once; retried on failure),
        but the DRA driver label of nodes where a pod still holds a GPU claim: it goes once the
        claim is released."""
        try:
            holders = await self._holders(self.sources.nodes())
            patched = await strip_nodes(self.kube, keep={n: frozenset({DRA_DRIVER_LABEL}) for n in holders})
            self._held = set(holders)
        except Exception:
            log.exception("removing our node labels after the last ClusterPolicy/GPUCluster was deleted failed; "
                          "retrying")
            await asyncio.sleep(self.settings.label_backoff.delay(1))
            self.kick.set()
            return
        kept = f"; the DRA driver label kept on {', '.join(sorted(self._held))} until their GPU claims are released" \
            if self._held else ""
        log.info("last ClusterPolicy/GPUCluster deleted: our labels and annotations removed from %d node(s)%s",
                 len(patched), kept)
        self._source, self._spec_policy, self.policy = None, None, None
