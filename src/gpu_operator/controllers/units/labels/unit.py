"""The node-labelling unit: one writer of node labels for both stacks.

Which stack a GPU node gets follows which CR is there: a ClusterPolicy -> the device-plugin label
set (by workload config), a GPUCluster -> the DRA label set. Both at once -> no label is touched
(both CRs report the conflict). Neither (the last one was deleted) -> our labels are taken back.
Leaving the DRA stack waits for claims: `nvidia.com/gpu.deploy.dra-driver` stays on a node while
a pod there holds a ResourceClaim allocated by gpu.nvidia.com (the kubelet plugin must unprepare
it), and the node is looked at again every `claim_recheck` seconds until it is released.

Events: a node's change, its driver pod's or its GFD NodeFeature's marks that node dirty; any
event of our CRs looks at whether the policy changed. Pacing IDLE_FIRST (controllers/loop.py): a
node event is served at once while the unit is idle, coalesced only under load, so the echoes of
a thousand patches are served in a few passes while a lone join is patched right away. A pass
costs what its dirty nodes cost (views looked up by name), not the cluster's size.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Literal

from gpu_operator.controllers.cleanup import strip_nodes
from gpu_operator.controllers.clock import REAL, Clock
from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER, NVIDIA_DRIVER
from gpu_operator.controllers.gpuholders import claim_holding_nodes
from gpu_operator.controllers.loop import Event, EventKind, NodeEvent, Pacing, Result, UnitBase
from gpu_operator.controllers.queries import NodeDriver
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.labels.labeller import LabelRetries, NodeLabeller
from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy
from gpu_operator.controllers.views import ClusterPolicyView, NodeView
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import DRA_DRIVER_LABEL

log = logging.getLogger("gpu_operator.operator")


class LabelUnit(UnitBase):
    name = "node labelling"
    pacing = Pacing.IDLE_FIRST

    def __init__(self, kube: Kube, settings: OperatorSettings, model: ReadModel, clock: Clock = REAL) -> None:
        self.kube = kube
        self.clock = clock
        self.settings = settings
        self.model = model
        self.backoff = settings.label_backoff
        self.dirty: set[str] = set()  # nodes to look at in the next pass (its queue)
        self.labeller = NodeLabeller(kube, concurrency=settings.label_concurrency)
        self.retries = LabelRetries(settings.label_backoff)
        self.policy: LabelPolicy | None = None
        self.drivers: dict[str, NodeDriver] | None = None
        self._source: ClusterPolicyView | None = None
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

    # -- the events it wants ------------------------------------------------------------------------

    def wants(self, event: Event) -> bool:
        if isinstance(event, NodeEvent):
            if event.view is None:
                self.retries.forget(event.name)
                return False
            self.dirty.add(event.name)
            return True
        if event.kind in (EventKind.DRIVER_POD, EventKind.GFD_FEATURES):
            if event.node:
                self.dirty.add(event.node)
            return event.kind is EventKind.DRIVER_POD or bool(event.node)
        return event.of(CLUSTER_POLICY, NVIDIA_DRIVER, GPU_CLUSTER)

    def failed(self, err: BaseException) -> None:
        """Not one node's patch (those are in the report): every node is looked at again."""
        self.dirty.update(v.name for v in self.model.nodes())

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def _node_drivers(self, policy: LabelPolicy) -> dict[str, NodeDriver] | None:
        return self.model.node_drivers() if policy.use_nvidia_driver_crd else None

    def _wanted(self) -> LabelPolicy | None | Literal[False]:
        """The policy to label by; None: nothing to label by now; False: take our labels back."""
        active = self.model.active_policy()
        clusters = self.model.gpuclusters()
        if active is not None and clusters:
            return None  # both: no label flips (both CRs say why in their status)
        if clusters:
            self._source = None
            # NVIDIADrivers own the DRA stack's driver when there are any (owner labels, upgrades)
            valid, _ = self.model.valid_drivers()
            return LabelPolicy(
                dra=True, use_nvidia_driver_crd=bool(valid), gfd_mirror=self.settings.gfd_node_labels
            )
        if active is None:
            return (
                False if self._source is not None or (self.policy is not None and self.policy.dra) else None
            )
        self._looking = (active.uid, active.generation)
        if self._source is not active:  # validated once per ClusterPolicy version
            self._source = active
            model = active.parsed.model  # parsed once per version (controllers/views.py)
            self._spec_policy = (
                replace(LabelPolicy.of(model.spec), gfd_mirror=self.settings.gfd_node_labels)
                if model is not None
                else None
            )
        return self._spec_policy or (self.policy if self.policy is not None and not self.policy.dra else None)

    async def _holders(self, views: list[NodeView]) -> frozenset[str]:
        """Nodes carrying the DRA driver label where a pod holds a gpu.nvidia.com claim (one list of
        ResourceClaims, only while some node carries the label)."""
        labelled = {v.name for v in views if DRA_DRIVER_LABEL in v.labels}
        if not labelled:
            return frozenset()
        claims = await self.kube.list_resource_claims()  # every namespace; None: DRA not served
        return claim_holding_nodes(claims or []) & labelled

    async def _claims(self, policy: LabelPolicy) -> LabelPolicy:
        """Leaving the DRA stack: the nodes that keep the DRA driver label for now. The claims are
        listed at most every `claim_recheck` seconds (the DRA plugin is gone, so no new claim is
        allocated there; a release is noticed within that time, as when no CR is left)."""
        if policy.dra:
            self._holders_seen = None
            return policy
        now = self.clock.monotonic()
        if self._holders_seen is None or now - self._holders_seen[0] >= self.settings.claim_recheck:
            self._holders_seen = (now, await self._holders(self.model.nodes()))
        holders = frozenset(
            name
            for name in self._holders_seen[1]
            if (v := self.model.node(name)) is not None and DRA_DRIVER_LABEL in v.labels
        )
        return replace(policy, claim_holders=holders)

    def _requeue(self) -> float | None:
        """Failed nodes wait for their own backoff (they wake neither this unit nor the others);
        nodes kept only by a GPU claim are looked at every `claim_recheck` seconds."""
        wait = self.retries.next_wait()
        if self._held or (self.policy is not None and self.policy.claim_holders):
            wait = min(wait if wait is not None else self.settings.claim_recheck, self.settings.claim_recheck)
        return wait

    async def reconcile(self) -> Result:
        self.dirty.update(self.retries.due())
        wanted = self._wanted()
        if wanted is False or wanted is None:
            self._seen = self._looking  # nothing to label by: no reconcile waits for this unit
            if wanted is False:
                await self._take_back()
            else:
                await self._release_held()
            return Result(self._requeue())
        self._held = set()  # a CR is back: its labelling pass decides these nodes' labels
        policy = await self._claims(wanted)
        per_node = self._node_drivers(policy)
        if policy != self.policy or per_node != self.drivers:
            # a new policy, stack or NVIDIADriver routing: every node is looked at (cheap when
            # unchanged). A fleet-wide pass is load by definition: it starts after the coalescing
            # window, like the reconcile the same change starts (begun at once instead, 1,000
            # nodes were labelled 1.5-3x slower: 7.5-14.4 s against 5-7.5 s, measured side by side)
            self._fleet, self._seen = True, self._looking
            try:
                await self.clock.sleep(self.settings.coalesce)
                started = self.clock.monotonic()  # the pass's own time (pacing counts it, not the window)
                self.policy, self.drivers = policy, per_node
                self.take_dirty()
                report = await self.labeller.label(
                    self.model.nodes(), policy, per_node, gfd=self.model.gfd_labels
                )
            finally:
                self._fleet = False
            self.retries.record(report)
            return Result(self._requeue(), busy=self.clock.monotonic() - started)
        else:
            self._seen = self._looking
            views = [v for n in self.take_dirty() if (v := self.model.node(n)) is not None]
            report = await self.labeller.label(
                views, policy, per_node, events=True, gfd=self.model.gfd_labels
            )
        self.retries.record(report)
        return Result(self._requeue())

    def holds_back(self) -> bool:
        """The ClusterPolicy reconcile and the upgrade pass wait while the active policy's labels
        are written (`labelling`)."""
        return self.labelling(self.model.active_policy())

    def labelling(self, active: ClusterPolicyView | None) -> bool:
        """True while a new ClusterPolicy's labels have yet to land: this loop has not looked at
        this version of `active`, or runs the fleet-wide pass it started. Its reconcile waits
        meanwhile (at most `labels_first_limit` per version): the DaemonSets it creates make the
        controller-manager, scheduler and kubelets start a pod per labelled node at once, and
        that load on the apiserver would slow the labelling every operand waits for anyway."""
        if active is None or self.model.gpuclusters():
            return False
        version = (active.uid, active.generation)
        if self._seen == version and not self._fleet:
            self._waiting = None
            return False
        now = self.clock.monotonic()
        if self._waiting is None or self._waiting[0] != version:
            self._waiting = (version, now, False)
        if now - self._waiting[1] < self.settings.labels_first_limit:
            return True
        if not self._waiting[2]:
            log.warning(
                "ClusterPolicy %s: its nodes are still being labelled after %.0f s; reconciling anyway",
                active.name,
                self.settings.labels_first_limit,
            )
            self._waiting = (version, self._waiting[1], True)
        return False

    async def _release_held(self) -> None:
        """Neither CR: the DRA driver label kept on claim-holding nodes goes once their claims are
        released (looked at every `claim_recheck` seconds)."""
        if not self._held:
            return
        try:
            holders = await self._holders([v for n in self._held if (v := self.model.node(n)) is not None])
            released = self._held - holders
            if released:
                await strip_nodes(self.kube, only=released)
                log.info(
                    "node(s) %s: GPU claims released; the DRA driver label removed",
                    ", ".join(sorted(released)),
                )
            self._held -= released
        except Exception as err:  # retried at the next recheck
            log.warning("releasing the DRA driver label of %s failed: %s", ", ".join(sorted(self._held)), err)

    async def _take_back(self) -> None:
        """Remove the labels and annotations we wrote from every node (once; retried on failure),
        but the DRA driver label of nodes where a pod still holds a GPU claim: it goes once the
        claim is released."""
        try:
            holders = await self._holders(self.model.nodes())
            patched = await strip_nodes(self.kube, keep={n: frozenset({DRA_DRIVER_LABEL}) for n in holders})
            self._held = set(holders)
        except Exception:
            log.exception(
                "removing our node labels after the last ClusterPolicy/GPUCluster was deleted failed; "
                "retrying"
            )
            raise
        kept = (
            f"; the DRA driver label kept on {', '.join(sorted(self._held))} until their GPU claims are released"
            if self._held
            else ""
        )
        log.info(
            "last ClusterPolicy/GPUCluster deleted: our labels and annotations removed from %d node(s)%s",
            len(patched),
            kept,
        )
        self._source, self._spec_policy, self.policy = None, None, None
