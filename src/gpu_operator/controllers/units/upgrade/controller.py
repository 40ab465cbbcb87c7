"""The driver upgrade controller: gathers node facts (driver pod revision, workload pods,
validators), asks the pure state machine (state.plan) for steps and carries them out
(one merge patch per node transition, Eviction API, driver pod deletion, Node events)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from gpu_operator.controllers import drain as node_drain
from gpu_operator.controllers.clock import REAL, Clock
from gpu_operator.controllers.gpuholders import RuntimeAccess
from gpu_operator.controllers.loop import Result
from gpu_operator.controllers.metrics import AUTO_UPGRADE
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.controllers.units.upgrade.owners import Owner
from gpu_operator.controllers.views import DriverPodView, NodeView, config_digest, pod_ready
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import (
    UPGRADE_EVENT_REASON,
    UPGRADE_STATE,
)

log = logging.getLogger("gpu_operator.upgrade")

VALIDATOR_SELECTOR = "app=nvidia-operator-validator"

IN_PROGRESS = Gauge(
    "gpu_operator_nodes_upgrades_in_progress", "Nodes on which a driver upgrade is in progress"
)
DONE = Gauge("gpu_operator_nodes_upgrades_done", "Nodes on which the driver upgrade is done")
FAILED = Gauge("gpu_operator_nodes_upgrades_failed", "Nodes on which the driver upgrade failed")
AVAILABLE = Gauge("gpu_operator_nodes_upgrades_available", "Upgrade slots available")
PENDING = Gauge("gpu_operator_nodes_upgrades_pending", "Nodes waiting for a driver upgrade")


def record(counts: us.Counts) -> None:
    IN_PROGRESS.set(counts.in_progress)
    DONE.set(counts.done)
    FAILED.set(counts.failed)
    AVAILABLE.set(counts.available)
    PENDING.set(counts.pending)


def driver_pod_facts(
    pod: DriverPodView,
    daemonsets: Mapping[str, Mapping[str, Any]],
    latest: Mapping[str, str | None],
    digests: dict[str, str] | None = None,
) -> us.DriverPod:
    """In sync when the pod's controller-revision-hash is its DaemonSet's latest revision; only its
    pod must restart when its configuration digest is its DaemonSet template's. `digests`: the
    template digests of the DaemonSets a pass has read so far (each read once a pass, not once a pod)."""
    ds = daemonsets.get(pod.daemonset)  # none for '' (no DaemonSet controls the pod)
    in_sync = ds is not None and pod.revision is not None and pod.revision == latest.get(pod.daemonset)
    template_digest = digests.get(pod.daemonset) if digests is not None else None
    if template_digest is None:
        template_digest = config_digest(((ds or {}).get("spec") or {}).get("template", {}).get("spec") or {})
        if digests is not None:
            digests[pod.daemonset] = template_digest
    return us.DriverPod(
        pod.name,
        pod.namespace,
        in_sync=in_sync,
        orphaned=ds is None,
        ready=pod.ready,
        restarts=pod.restarts,
        terminating=pod.deleting,
        restart_only=bool(template_digest) and template_digest == pod.digest,
    )


def latest_revisions(revisions: Iterable[Mapping[str, Any]]) -> dict[str, str | None]:
    """Per DaemonSet uid, the hash of its newest ControllerRevision (one scan of the list)."""
    by_owner: dict[str, list[Mapping[str, Any]]] = {}
    for rev in revisions:
        for ref in (rev.get("metadata") or {}).get("ownerReferences") or []:
            by_owner.setdefault(ref.get("uid", ""), []).append(rev)
    return {uid: us.latest_revision_hash(revs) for uid, revs in by_owner.items()}


@dataclass(frozen=True)
class PassPod:
    """A driver pod as one pass sees it: its node, the owners of its DaemonSet, its facts."""

    node: str
    owners: frozenset[str]  # uids in its DaemonSet's ownerReferences (empty: orphaned)
    driver: us.DriverPod


def pass_pods(
    pods: Iterable[DriverPodView],
    daemonsets: Mapping[str, Mapping[str, Any]],
    latest: Mapping[str, str | None],
) -> list[PassPod]:
    """Every scheduled driver pod's facts, against every DaemonSet in the namespace (so that a
    pod counts as orphaned only when its DaemonSet does not exist at all), read once per pass."""
    out: list[PassPod] = []
    owners: dict[str, frozenset[str]] = {}  # per DaemonSet, read once a pass (a 1,000-node pass has one)
    digests: dict[str, str] = {}
    for pod in pods:
        if not pod.node:
            continue
        if pod.daemonset not in owners:
            ds_meta = (daemonsets.get(pod.daemonset) or {}).get("metadata") or {}
            owners[pod.daemonset] = frozenset(r.get("uid", "") for r in ds_meta.get("ownerReferences") or [])
        out.append(
            PassPod(pod.node, owners[pod.daemonset], driver_pod_facts(pod, daemonsets, latest, digests))
        )
    return out


def drivers_by_node(pods: Iterable[PassPod], owner_uid: str) -> dict[str, us.DriverPod]:
    """Per node, the driver pod one owner's pass looks at: a pod of a DaemonSet this owner owns,
    else an orphaned one (its DaemonSet is gone, e.g. after the switch to NVIDIADrivers). A pod of
    another owner's DaemonSet is that owner's business, never this one's."""
    out: dict[str, us.DriverPod] = {}
    for pod in pods:
        if owner_uid not in pod.owners and not pod.driver.orphaned:
            continue
        if pod.node not in out or out[pod.node].orphaned:
            out[pod.node] = pod.driver
    return out


def validators_ready(pods: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
    """Per node, whether all its validator pods are ready."""
    ready: dict[str, bool] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            ready[node] = ready.get(node, True) and pod_ready(pod)
    return ready


@dataclass(frozen=True)
class PassLists:
    """What one pass lists once and every owner's pass reads."""

    pods: tuple[PassPod, ...] = ()
    validators: Mapping[str, bool] = field(default_factory=dict)


def node_patch(step: us.UpgradeStep) -> dict[str, Any]:
    """One merge patch for a node's transition: state label, annotations, cordon."""
    patch: dict[str, Any] = {"metadata": {}}
    if step.state is not None:
        patch["metadata"]["labels"] = {UPGRADE_STATE: step.state}
    if step.remove_state:
        patch["metadata"]["labels"] = {UPGRADE_STATE: None}
    if step.annotations:
        patch["metadata"]["annotations"] = dict(step.annotations)
    if step.cordon is not None:
        patch["spec"] = {"unschedulable": step.cordon}
    return patch


POD_STATES = (us.WAIT_FOR_JOBS_REQUIRED, us.POD_DELETION_REQUIRED, us.DRAIN_REQUIRED)


def node_facts(
    node: NodeView,
    drivers: Mapping[str, us.DriverPod],
    validators: Mapping[str, bool],
    pods: tuple[us.PodFacts, ...],
) -> us.UpgradeNodeFacts:
    """What the state machine reads of one node: its view, its driver pod, whether its validator is
    ready, and (in a pod-reading state) its pods."""
    return us.UpgradeNodeFacts(
        node.name,
        labels=node.selectable,
        annotations=node.annotations,
        unschedulable=node.unschedulable,
        ready=node.ready,
        driver=drivers.get(node.name),
        pods=pods,
        validators_ready=validators.get(node.name),
    )


# States a node leaves only on a watched event (its driver pod, its labels or annotations, a slot
# freed by another node's progress, a policy or NVIDIADriver edit), never by time: while every node
# rests, passes run on kicks and the idle resync only. upgrade-required is one of them: a node
# waiting for a slot waits on another node, which is in progress (and polled) itself; one held by
# the skip label, a pause or maxUnavailable waits on an edit.
RESTING = (us.UNKNOWN, us.UPGRADE_DONE, us.UPGRADE_FAILED, us.UPGRADE_REQUIRED)


def reflects(view: NodeView, patch: Mapping[str, Any]) -> bool:
    """Whether a node's view shows a merge patch we sent (labels, annotations, cordon)."""
    meta = patch.get("metadata") or {}
    for current, wanted in (
        (view.selectable, meta.get("labels") or {}),
        (view.annotations, meta.get("annotations") or {}),
    ):
        if any(current.get(k) != v for k, v in wanted.items()):
            return False
    cordon = (patch.get("spec") or {}).get("unschedulable")
    return cordon is None or view.unschedulable == cordon


class UpgradeController:
    """Nodes come from the operator's Node reflector (`nodes()`) and driver pods from its driver pod
    watch (`driver_pods()`), not from a list per pass (at 5,000 nodes that list cost 1.6 s of CPU,
    and a rollout's driver pod events start a pass every few seconds). A pass plans only once those views show every node
    patch and driver pod deletion the previous passes sent: planning on a view older than our own
    writes could start more than maxParallelUpgrades nodes or repeat a step."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        nodes: Callable[[], Iterable[NodeView]],
        settings: OperatorSettings | None = None,
        *,
        driver_pods: Callable[[], Iterable[DriverPodView]],
        clock: Clock = REAL,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.namespace = namespace
        self.nodes = nodes
        self.driver_pods = driver_pods
        self.settings = settings or OperatorSettings()
        concurrency = self.settings.upgrade_concurrency
        self.blocked: node_drain.EvictionRefusals = {}  # (ns, pod) -> "ns/pdb" of its last refused eviction
        self.gate = asyncio.Semaphore(concurrency)
        self.sent: dict[str, dict[str, Any]] = {}  # node -> its last patch the reflector has not shown yet
        self.deleted: set[tuple[str, str]] = set()  # driver pods we deleted that the watch still shows live
        self.waiting_since: float | None = None
        self.access = RuntimeAccess()

    def caught_up(
        self, views: Mapping[str, NodeView], pods: Mapping[tuple[str, str], DriverPodView] | None = None
    ) -> bool:
        """Drops the sent patches the views show (or whose node is gone) and the deleted driver pods
        the watch shows terminating or gone; True when none is left, or when the watches have lagged
        for `upgrade_view_lag_limit` seconds (then planning goes on with what it has, and says so)."""
        self.sent = {n: p for n, p in self.sent.items() if n in views and not reflects(views[n], p)}
        pods = pods or {}
        self.deleted = {k for k in self.deleted if k in pods and not pods[k].deleting}
        if not self.sent and not self.deleted:
            self.waiting_since = None
            return True
        now = self.clock.monotonic()
        self.waiting_since = self.waiting_since or now
        if now - self.waiting_since < self.settings.upgrade_view_lag_limit:
            return False
        example = next(iter(self.sent), None) or "/".join(next(iter(self.deleted)))
        log.warning(
            "the watches have not shown %d of our upgrade patches and %d driver pod deletions for "
            "%.0f s (e.g. %s); planning anyway",
            len(self.sent),
            len(self.deleted),
            now - self.waiting_since,
            example,
        )
        self.sent.clear()
        self.deleted.clear()
        self.waiting_since = None
        return True

    async def reconcile(self, owners: Sequence[Owner], access: RuntimeAccess | None = None) -> Result:
        """One pass: the state machine once per owner (the ClusterPolicy, or each NVIDIADriver),
        each on its own nodes with its own policy and pause; the lists are read once and shared.
        `access`: how pods reach GPUs without asking for them (the ClusterPolicy's runtime).
        Its Result says when to look again."""
        self.access = access or RuntimeAccess()
        # upstream's gauge: 1 while an owner's upgradePolicy.autoUpgrade is on (the ClusterPolicy's
        # driver.upgradePolicy, off with sandbox workloads; or any NVIDIADriver's), else 0
        auto_upgrade = any(owner.policy.auto_upgrade for owner in owners)
        AUTO_UPGRADE.set(1 if auto_upgrade else 0)
        if not owners:
            return Result(self.settings.upgrade_idle_requeue)
        views = {v.name: v for v in self.nodes()}
        pods = {(p.namespace, p.name): p for p in self.driver_pods() if p.namespace == self.namespace}
        if not self.caught_up(views, pods):
            return Result(self.settings.upgrade_view_wait)
        lists = PassLists()
        if auto_upgrade:
            lists = await self._lists(views, pods.values())
        counts: list[us.Counts] = []
        busy = False
        for owner in owners:
            owner_counts, owner_busy = await self._owner_pass(owner, owner.scope(views), lists)
            counts.append(owner_counts)
            busy = busy or owner_busy
        record(us.total(counts))
        return Result(self.settings.upgrade_active_requeue if busy else self.settings.upgrade_idle_requeue)

    async def _lists(self, views: Mapping[str, NodeView], driver_pods: Iterable[DriverPodView]) -> PassLists:
        ns = self.namespace
        dss = await self.kube.list_items("apps", "v1", "daemonsets", ns)
        daemonsets = {d["metadata"]["uid"]: d for d in dss}
        latest = latest_revisions(await self.kube.list_items("apps", "v1", "controllerrevisions", ns))
        validators: list[dict[str, Any]] = []
        if any(v.selectable.get(UPGRADE_STATE) == us.VALIDATION_REQUIRED for v in views.values()):
            # only that state reads them: no list of one pod per node on the other passes; slim:
            # one pod per node, whose whole bodies would be most of a pass's cost
            validators = await self.kube.list_pods(ns, labels=VALIDATOR_SELECTOR, slim=True)
        return PassLists(tuple(pass_pods(driver_pods, daemonsets, latest)), validators_ready(validators))

    async def _owner_pass(
        self, owner: Owner, views: Mapping[str, NodeView], lists: PassLists
    ) -> tuple[us.Counts, bool]:
        """The state machine for one owner's nodes: (its counts, whether an upgrade is under way)."""
        if not owner.policy.auto_upgrade:  # only nodes that still carry a state label
            result = us.plan(
                [
                    us.UpgradeNodeFacts(v.name, labels=v.selectable)
                    for v in views.values()
                    if UPGRADE_STATE in v.selectable
                ],
                owner.policy,
                self.clock.wall(),
            )
            await self._execute(result.steps, {})
            return result.counts, False
        by_node = drivers_by_node(lists.pods, owner.owner_uid)
        # only the nodes in a pod-reading state wait for I/O: one task each, not one per node
        reading = [v.name for v in views.values() if v.selectable.get(UPGRADE_STATE) in POD_STATES]
        pods = dict(
            zip(
                reading,
                await asyncio.gather(*(self._pods_on(name, owner.policy) for name in reading)),
                strict=True,
            )
        )
        facts_list = [node_facts(v, by_node, lists.validators, pods.get(v.name, ())) for v in views.values()]
        managed = [f for f in facts_list if f.driver is not None or f.state != us.UNKNOWN]
        result = us.plan(managed, owner.policy, self.clock.wall(), paused=owner.paused)
        await self._execute(result.steps, {f.name: f for f in managed})
        busy = any(f.state not in RESTING for f in managed) or any(s.state is not None for s in result.steps)
        return result.counts, busy

    async def _pods_on(self, node: str, policy: us.Policy) -> tuple[us.PodFacts, ...]:
        async with self.gate:
            return await node_drain.pods_on(
                self.kube,
                node,
                self.blocked,
                access=self.access,
                wait_selector=policy.wait_selector,
                drain_selector=policy.drain_selector,
                operands=self.namespace,
            )

    async def _execute(
        self, steps: Sequence[us.UpgradeStep], facts: Mapping[str, us.UpgradeNodeFacts]
    ) -> None:
        await asyncio.gather(*(self._apply(step, facts.get(step.node)) for step in steps))

    async def _apply(self, step: us.UpgradeStep, node: us.UpgradeNodeFacts | None) -> None:
        async with self.gate:
            try:
                patch = node_patch(step)
                if patch != {"metadata": {}}:
                    await self.kube.merge_patch("v1", "Node", step.node, patch)
                    self.sent[step.node] = patch
                await node_drain.evict(self.kube, step.evict, self.blocked)
                if step.delete_driver_pod and node is not None and node.driver is not None:
                    await self._delete_pod(node.driver.namespace, node.driver.name)
                    self.deleted.add((node.driver.namespace, node.driver.name))
                if (
                    step.state is not None
                    or step.remove_state
                    or step.delete_driver_pod
                    or (step.message and step.warning)
                ):
                    log.info("node %s: %s", step.node, step.message)
                    await self.kube.node_event(
                        step.node, UPGRADE_EVENT_REASON, step.message, warning=step.warning
                    )
            except Exception as err:  # one node's failure must not stop the others; next pass retries
                log.warning("node %s: upgrade step failed: %s", step.node, err)

    async def _delete_pod(self, namespace: str, name: str) -> None:
        from gpu_operator.kube.client import ObjectKey

        await self.kube.delete(ObjectKey("v1", "Pod", name, namespace))
