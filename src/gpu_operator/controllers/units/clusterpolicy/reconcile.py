"""The ClusterPolicy reconcile: read the pass's `ReadSnapshot` (controllers/readmodel.py), render,
apply the difference, write status. The one read a pass makes besides is `configmap_keys`: a GET
of each user ConfigMap the policy names for the driver (repo, certs, kernel modules), whose keys the
driver mounts file by file (user ConfigMaps are not watched), and `plugin_config_hash`: a GET of
the devicePlugin.config ConfigMap (watched by name: an edit is an event, kube/configwatch.py),
whose content's hash the plugins' pod templates carry."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from time import monotonic

import pydantic
from lightkube.core.exceptions import ApiError
from prometheus_client import Counter

from gpu_operator import vocabulary as vocab
from gpu_operator.api.clusterpolicy import ClusterPolicy, ClusterPolicySpec
from gpu_operator.controllers import status as st
from gpu_operator.controllers.apply import Applier, ReconcileReport, owner_reference
from gpu_operator.controllers.environment import operator_env_now
from gpu_operator.controllers.kmodconfig import kernel_module_data
from gpu_operator.controllers.passinputs import ReadOnce, configmap_keys, plugin_config_hash
from gpu_operator.controllers.queries import active_policy, validation_message
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.clusterpolicy import kubevirt, runtimes
from gpu_operator.controllers.units.clusterpolicy.podsecurity import NamespaceLabeller
from gpu_operator.controllers.views import ClusterPolicyView, NodeView, object_key
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.render import ClusterFacts, RenderError, RenderResult, render
from gpu_operator.render.facts import NodeFacts
from gpu_operator.render.kubevirt import KubeVirtFinding

log = logging.getLogger("gpu_operator.clusterpolicy")


async def policy_facts(
    kube: Kube,
    policy: ClusterPolicy,
    nodes: list[NodeFacts],
    *,
    namespace: str,
    k8s_version: str,
    operator_env: Mapping[str, str],
    openshift: bool,
    openshift_version: str,
    servicemonitor_crd: bool,
) -> ClusterFacts:
    """What the renderer needs beside the policy: the cluster's facts and, read once each, the user
    ConfigMaps the policy names (the reconcile and `gpu-operator diff` render alike)."""
    reads = ReadOnce(kube)  # each user ConfigMap GET once in this pass
    return ClusterFacts.of(
        nodes,
        namespace=namespace,
        k8s_version=k8s_version,
        operator_env=operator_env,
        openshift=openshift,
        openshift_version=openshift_version,
        servicemonitor_crd=servicemonitor_crd,
        configmap_keys=await configmap_keys(reads, policy, namespace),
        configmap_data=await kernel_module_data(reads, policy, namespace, nodes),
        plugin_config_hash=await plugin_config_hash(reads, policy, namespace),
    )


RENDERS = Counter(
    "gpu_operator_clusterpolicy_renders",
    "ClusterPolicy passes that rendered its objects, or reused the last render of equal inputs",
    ["result"],
)


@dataclass(frozen=True)
class LastRender:
    """The last render and what it was rendered from. The renderer is pure: the same policy
    (name and spec) and the same facts give the same objects, so a pass whose inputs are equal
    reuses them. During a rollout most passes are such (a DaemonSet's status, a node's label no
    code has read: render/readlabels.py), and a render costs 15-30 ms at 1,000 nodes against ~2 ms to compare."""

    name: str
    spec: ClusterPolicySpec
    facts: ClusterFacts
    result: RenderResult
    problems: Mapping[str, str]  # runtimes.unserved_nodes of the same inputs

    def answers(self, policy: ClusterPolicy, facts: ClusterFacts) -> bool:
        return (
            self.name == policy.metadata.name
            and (self.spec is policy.spec or self.spec == policy.spec)
            and self.facts.renders_like(facts)
        )


@dataclass(frozen=True)
class NodeSummary:
    """What every pass reads of every node: their facts and three counts. Built again only when a
    node view changed: a view is replaced, not changed, so the last pass's tuple of views compares
    equal by identity, in one C loop, where a rebuild walked 1,000 nodes four times in Python
    (0.2 ms a pass unprofiled, ~0.1 s a 1,000-node run; the profile's 3 % was mostly the
    profiler's own cost: bench/README.md, 2026-12-03)."""

    nodes: tuple[NodeView, ...]
    facts: list[NodeFacts]
    has_nfd: bool
    gpu_nodes: int
    unlabelled: int  # NFD found an NVIDIA GPU and gpu.present is not set yet

    @classmethod
    def of(cls, nodes: tuple[NodeView, ...]) -> NodeSummary:
        return cls(
            nodes,
            [n.facts for n in nodes],
            any(n.has_nfd for n in nodes),
            sum(1 for n in nodes if n.gpu_present),
            sum(1 for n in nodes if n.nfd_gpu and not n.gpu_present),
        )


class ClusterPolicyReconciler:
    def __init__(
        self, kube: Kube, settings: OperatorSettings | None = None, images: Mapping[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings or OperatorSettings()
        # the operand images of the operator's environment (controllers/environment.py), read once
        self.images = dict(images) if images is not None else operator_env_now()
        self._vm_findings: set[KubeVirtFinding] = set()  # VM passthrough findings already sent as Events
        self.applier = Applier(kube)
        self.namespace_labeller = NamespaceLabeller(kube)
        self._warned: set[tuple[str, int, str]] = set()  # (uid, generation, warning) sent as an Event
        self._runtime_events: set[tuple[str, ...]] = set()  # unrecognised runtimes told on their nodes
        self._written_at: dict[str, float] = {}  # policy uid -> when its status was last written
        self.last_render: LastRender | None = None
        self.renders = 0  # renders made (the others reused `last_render`)
        self._summary: NodeSummary | None = None
        self.summaries = 0  # node summaries built (the others reused `_summary`)

    def summary(self, nodes: tuple[NodeView, ...]) -> NodeSummary:
        """The nodes' `NodeSummary`, the last one while no view changed."""
        last = self._summary
        if last is None or last.nodes != nodes:
            last = self._summary = NodeSummary.of(nodes)
            self.summaries += 1
        return last

    async def reconcile(self, snap: ReadSnapshot) -> ReconcileReport:
        report = ReconcileReport()
        nodes = self.summary(snap.nodes)
        report.has_nfd = nodes.has_nfd
        report.gpu_nodes = nodes.gpu_nodes
        active = active_policy(snap.policies)
        if active is None:
            return report
        for other in snap.policies:
            if other is not active and other.status.get("state") != vocab.IGNORED:
                log.info("ClusterPolicy %s ignored: %s is the active one (oldest)", other.name, active.name)
                await self.kube.patch_status(
                    "ClusterPolicy", other.name, {"state": vocab.IGNORED, "namespace": snap.namespace}
                )

        if snap.gpuclusters:
            report.requeue = self.settings.requeue_conflict
            return await self._finish(
                report,
                active,
                snap,
                st.ReconcileOutcome.failed(st.conflict_message(snap.gpuclusters[0].name, active.name)),
            )
        try:
            policy = active.parsed.valid()  # parsed once per version (controllers/views.py)
            facts = await policy_facts(
                self.kube,
                policy,
                nodes.facts,
                namespace=snap.namespace,
                k8s_version=snap.info.k8s_version,
                operator_env=self.images,
                openshift=snap.info.openshift,
                openshift_version=snap.info.openshift_version,
                servicemonitor_crd=snap.info.servicemonitor_crd,
            )
            result, problems = self._render(policy, facts)
        except pydantic.ValidationError as err:
            return await self._finish(
                report, active, snap, st.ReconcileOutcome.failed(validation_message(err))
            )
        except RenderError as err:
            return await self._finish(report, active, snap, st.ReconcileOutcome.failed(str(err)))

        try:
            await self._warn(active, result.warnings)
            await runtimes.node_events(self.kube, problems, self._runtime_events)
            await self.namespace_labeller.ensure(policy, snap.namespace)
            await self._apply(result, active, snap, report)
        except ApiError as err:
            message = f"Failed to reconcile: {err.status.message}"
            log.error("ClusterPolicy %s: %s", active.name, message)
            return await self._finish(report, active, snap, st.ReconcileOutcome.failed(message))

        await self._kubevirt(policy, active, snap, report)
        report.not_ready = self._not_ready_states(result, snap, report)
        unlabelled = nodes.unlabelled
        upgrading = st.upgrade_incomplete(
            policy.spec.driver.useNvidiaDriverCRD, (n.labels for n in snap.nodes)
        )
        result_outcome = runtimes.outcome(
            st.outcome(report.not_ready, report.has_nfd, report.gpu_nodes > 0, unlabelled, upgrading),
            problems,
        )
        return await self._finish(report, active, snap, result_outcome)

    def _render(self, policy: ClusterPolicy, facts: ClusterFacts) -> tuple[RenderResult, Mapping[str, str]]:
        """render() and the unserved nodes, or the last ones where the inputs are equal (`LastRender`)."""
        last = self.last_render
        if last is not None and last.answers(policy, facts):
            RENDERS.labels("reused").inc()
            if last.facts is not facts:
                # the render is these facts' too: the next pass compares only the nodes changed since
                # this one (unchanged facts are the same objects), not every node changed since the render
                self.last_render = dataclasses.replace(last, facts=facts)
            return last.result, last.problems
        RENDERS.labels("rendered").inc()
        result = render(policy, facts)
        problems = runtimes.unserved_nodes(policy, facts)
        self.last_render = LastRender(policy.metadata.name, policy.spec, facts, result, problems)
        self.renders += 1
        return result, problems

    async def _warn(self, policy: ClusterPolicyView, warnings: list[str]) -> None:
        """Each render warning once per policy generation: logged and a Warning Event on the policy."""
        for warning in warnings:
            key = (policy.uid, policy.generation, warning)
            if key in self._warned:
                continue
            log.warning("ClusterPolicy %s: %s", policy.name, warning)
            await self.kube.event(
                {
                    "apiVersion": "nvidia.com/v1",
                    "kind": "ClusterPolicy",
                    "name": policy.name,
                    "uid": policy.uid,
                },
                vocab.POLICY_WARNING_REASON,
                warning,
            )
            self._warned.add(key)

    async def _apply(
        self, result: RenderResult, policy: ClusterPolicyView, snap: ReadSnapshot, report: ReconcileReport
    ) -> None:
        await self.applier.apply(
            result, policy, owner_reference(policy), snap.owned, snap.watched_kinds, report
        )

    async def _kubevirt(
        self, policy: ClusterPolicy, active: ClusterPolicyView, snap: ReadSnapshot, report: ReconcileReport
    ) -> None:
        """VM passthrough: KubeVirt's permitted host devices and the VMPassthrough condition."""
        try:
            synced = await kubevirt.sync(self.kube, policy, snap.nodes)
        except ApiError as err:
            report.extra_conditions = [
                {
                    "type": vocab.VM_PASSTHROUGH_CONDITION,
                    "status": "False",
                    "reason": vocab.HOST_DEVICES_NOT_SYNCED,
                    "message": f"KubeVirt sync failed: {err.status.message}",
                }
            ]
            report.requeue = self.settings.requeue_not_ready
            return
        if synced.condition:
            report.extra_conditions = [synced.condition]
        if synced.retry:
            report.requeue = self.settings.requeue_not_ready
        # One Event per finding while it lasts (not one per pass); one that goes and comes back is new.
        current = set(synced.findings)
        await kubevirt.emit(
            self.kube, [f for f in synced.findings if f not in self._vm_findings], active.name
        )
        self._vm_findings = current

    def _not_ready_states(
        self, result: RenderResult, snap: ReadSnapshot, report: ReconcileReport
    ) -> list[str]:
        not_ready = []
        for state in result.states:
            if not state.enabled:
                continue
            for obj in state.objects:
                if obj["kind"] != "DaemonSet":
                    continue
                meta = obj["metadata"]
                live = snap.owned.get(
                    object_key(obj["apiVersion"], "DaemonSet", meta.get("namespace"), meta["name"])
                )
                applied_now = str(ObjectKey.of(obj)) in report.applied
                if (
                    live is None
                    or live.readiness is None
                    or applied_now
                    or not st.daemonset_ready(live.readiness)
                ):
                    not_ready.append(state.name)
                    break
        return not_ready

    async def _finish(
        self,
        report: ReconcileReport,
        policy: ClusterPolicyView,
        snap: ReadSnapshot,
        outcome: st.ReconcileOutcome,
    ) -> ReconcileReport:
        report.outcome = outcome
        wanted = st.status_body(
            outcome, snap.namespace, policy.status, policy.generation, report.extra_conditions
        )
        current = {k: policy.status.get(k) for k in ("state", "namespace", "conditions")}
        if st.status_differs(current, wanted):
            last = self._written_at.get(policy.uid)
            hold = 0.0 if last is None else self.settings.status_message_hold - (monotonic() - last)
            if hold > 0 and st.message_only(current, wanted):
                report.requeue = min(report.requeue or hold, hold)  # the pass then writes the latest
            else:
                log.info(
                    "ClusterPolicy %s: %s (%s) %s",
                    policy.name,
                    outcome.state,
                    outcome.reason,
                    outcome.message,
                )
                await self.kube.patch_status("ClusterPolicy", policy.name, wanted)
                self._written_at[policy.uid] = monotonic()
        if outcome.state == vocab.NOT_READY and outcome.poll:
            # Operands still rolling out, or an error that may depend on objects we do not
            # watch (a ConfigMap the policy names): look again soon. Reads only; the status is
            # written only when it changes. (A GPUCluster beside it set its own, longer time.)
            # Not for an NVIDIADriver upgrade alone: its nodes' label changes kick the reconcile.
            report.requeue = report.requeue or self.settings.requeue_not_ready
        elif outcome.reason == vocab.NFD_LABELS_MISSING:
            report.requeue = self.settings.requeue_no_nfd
        elif report.requeue is None and report.extra_conditions:
            report.requeue = self.settings.requeue_kubevirt
        return report
