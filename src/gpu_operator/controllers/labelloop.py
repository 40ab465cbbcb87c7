"""The node-labelling loop: one writer of node labels for both stacks.

Which stack a GPU node gets follows which CR is there: a ClusterPolicy -> the device-plugin label
set (by workload config), a GPUCluster -> the DRA label set. Both at once -> no label is touched
(both CRs report the conflict). Neither (the last one was deleted) -> our labels are taken back.
Leaving the DRA stack waits for claims: `nvidia.com/gpu.deploy.dra-driver` stays on a node while
a pod there holds a ResourceClaim allocated by gpu.nvidia.com (the kubelet plugin must unprepare
it), and the node is looked at again every `claim_recheck` seconds until it is released.

A node event is served at once while the loop is idle; events are coalesced only under load:
after a pass the next one waits up to twice as long as the pass took (at most `coalesce`), so
the echoes of a thousand patches are served in a few passes while a lone join is patched right
away. A pass costs what its dirty nodes cost (views looked up by name), not the cluster's size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from gpu_operator.controllers.cache import DriverPodView, NodeView, PolicyView
from gpu_operator.controllers.cleanup import strip_nodes
from gpu_operator.controllers.clusterpolicy import active_policy
from gpu_operator.controllers.labeller import LabelRetries, NodeLabeller
from gpu_operator.controllers.leader import log_pass_failure
from gpu_operator.controllers.nodelabels import LabelPolicy, NodeDriver
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
    # the labels GPU feature discovery publishes for a node (its NodeFeature), None if none
    gfd: Callable[[str], Mapping[str, str] | None] = lambda _name: None


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
        # the ClusterPolicy version (uid, generation) the loop last labelled by, and whether the
        # fleet-wide pass it started is still running: what `labelling()` reports
        self._looking: tuple[str, int] | None = None  # the version `_wanted` read this pass
        self._seen: tuple[str, int] | None = None
        self._fleet = False
        self._waiting: tuple[tuple[str, int], float, bool] | None = None  # version, since, warned

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
            return LabelPolicy(dra=True, use_nvidia_driver_crd=bool(valid), gfd_mirror=self.settings.gfd_node_labels)
        if active is None:
            return False if self._source is not None or (self.policy is not None and self.policy.dra) else None
        self._looking = (active.uid, active.generation)
        if self._source is not active:  # validated once per ClusterPolicy version
            self._source = active
            model = active.as_policy.model  # parsed once per version (controllers/cache.py)
            self._spec_policy = (replace(LabelPolicy.of(model.spec), gfd_mirror=self.settings.gfd_node_labels)
                                 if model is not None else None)
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
            if wanted is False or wanted is None:
                self._seen = self._looking  # nothing to label by: no reconcile waits for this loop
                await (self._take_back() if wanted is False else self._release_held())
                continue
            self._held = set()  # a CR is back: its labelling pass decides these nodes' labels
            try:
                policy = await self._claims(wanted)
                per_node = self._node_drivers(policy)
                if policy != self.policy or per_node != self.drivers:
                    # a new policy, stack or NVIDIADriver routing: every node is looked at (cheap
                    # when unchanged). A fleet-wide pass is load by definition: it starts after
                    # the coalescing window, like the reconcile the same change starts (begun at
                    # once instead, 1,000 nodes were labelled 1.5-3x slower: 7.5-14.4 s against
                    # 5-7.5 s, measured side by side)
                    self._fleet, self._seen = True, self._looking
                    try:
                        await asyncio.sleep(self.settings.coalesce)
                        started = time.monotonic()  # the pass's own time (its pause follows it)
                        self.policy, self.drivers = policy, per_node
                        self.take_dirty()
                        report = await self.labeller.label(self.sources.nodes(), policy, per_node,
                                                           gfd=self.sources.gfd)
                    finally:
                        self._fleet = False
                else:
                    self._seen = self._looking
                    views = [v for n in self.take_dirty() if (v := self.sources.node(n)) is not None]
                    report = await self.labeller.label(views, policy, per_node, events=True, gfd=self.sources.gfd)
            except Exception as err:  # not one node's patch (those are in the report): retry them all
                failures += 1
                delay = self.settings.label_backoff.delay(failures)
                log_pass_failure(log, f"node labelling failed ({err})", failures, delay)
                self.dirty().update(v.name for v in self.sources.nodes())
                await asyncio.sleep(delay)
                self.kick.set()
                continue
            failures = 0
            # Failed nodes wait for their own backoff; they wake neither this loop nor the others.
            self.retries.record(report)
            ended = time.monotonic()
            quiet_from = ended + min(self.settings.coalesce, 2 * (ended - started))

    def labelling(self, active: PolicyView | None) -> bool:
        """True while a new ClusterPolicy's labels have yet to land: this loop has not looked at
        this version of `active`, or runs the fleet-wide pass it started. Its reconcile waits
        meanwhile (at most `labels_first_limit` per version): the DaemonSets it creates make the
        controller-manager, scheduler and kubelets start a pod per labelled node at once, and
        that load on the apiserver would slow the labelling every operand waits for anyway."""
        if active is None or self.sources.clusters():
            return False
        version = (active.uid, active.generation)
        if self._seen == version and not self._fleet:
            self._waiting = None
            return False
        now = time.monotonic()
        if self._waiting is None or self._waiting[0] != version:
            self._waiting = (version, now, False)
        if now - self._waiting[1] < self.settings.labels_first_limit:
            return True
        if not self._waiting[2]:
            log.warning("ClusterPolicy %s: its nodes are still being labelled after %.0f s; reconciling anyway",
                        active.name, self.settings.labels_first_limit)
            self._waiting = (version, self._waiting[1], True)
        return False

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
