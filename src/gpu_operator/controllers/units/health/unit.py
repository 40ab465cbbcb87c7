"""The GPU health unit: turns each node's health report (the agent's annotation) into the
NvidiaGPUReady condition, our taints, one Event per change and the node's health metric
(controllers/units/health/rules.py decides; this unit reads and writes), and, where the policy opts in,
drives remediation (controllers/units/health/machine.py). On the DRA stack (GPUCluster) it also keeps one
DeviceTaintRule per unhealthy GPU where the apiserver serves them (controllers/units/health/dra.py).

`policy` yields the health settings of the active stack: a valid ClusterPolicy's spec.health, or
their defaults under a GPUCluster (which has no spec.health); None: change nothing.

A pass parses each node's report once (api/health.py's NodeReport): the signals, the remediation
machine and the DRA device taints share it.

It serves a node's change at once (IDLE_FIRST): `wants` records the nodes whose health facts
changed; a pass looks at those only (every node after a ClusterPolicy change or a failed pass).
A node already as desired costs no write, so our own writes' echoes end there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpu_operator.api.health import NodeReport
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.controllers.customresources import CLUSTER_POLICY, GPU_CLUSTER
from gpu_operator.controllers.gpuholders import RuntimeAccess
from gpu_operator.controllers.loop import (
    Event,
    EventKind,
    NodeEvent,
    NodePass,
    NodeQueue,
    ObjectEvent,
    Pacing,
    Result,
    UnitBase,
)
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.health import machine as hm
from gpu_operator.controllers.units.health import rules as hr
from gpu_operator.controllers.units.health.dra import DeviceTaints
from gpu_operator.controllers.units.health.executor import Executor
from gpu_operator.controllers.units.health.metrics import NODE_HEALTH, REMEDIATIONS
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube import nodestatus
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import (
    HEALTH_CONDITION,
    HEALTH_EVENT_REASON,
    HEALTH_REPORT_ANNOTATION,
    HEALTH_STATE,
    UPGRADE_STATE,
)

log = logging.getLogger("gpu_operator.health")


def report_of(view: NodeView) -> NodeReport:
    """The node's report, parsed: once per node per pass."""
    return NodeReport.of(view.annotations.get(HEALTH_REPORT_ANNOTATION))


def facts_of(
    view: NodeView,
    report: NodeReport,
    state: str | None = None,
    notes: Mapping[str, str | None] | None = None,
) -> hr.SignalFacts:
    """The signals' facts of a node (`report`: its report as this pass parsed it); `state` and
    `notes`: what a remediation step wrote just now."""
    cond = view.gpu_condition
    merged = {**view.annotations, **(notes or {})}
    reason = merged.get(hm.REASON) or (f"action {merged[hm.ACTION]}" if merged.get(hm.ACTION) else "")
    return hr.SignalFacts(
        view.name,
        report,
        hr.HealthCondition(*cond) if cond is not None else None,
        tuple(hr.Taint(k, e, v) for k, e, v in view.taints),
        view.labels.get(HEALTH_STATE, "") if state is None else state,
        reason,
    )


def _watched(view: NodeView) -> tuple[object, ...]:
    """What the unit reads of a node: a change of any of these kicks it."""
    health_notes = tuple(sorted((k, v) for k, v in view.annotations.items() if k.startswith(hm.PREFIX)))
    return (
        health_notes,
        view.taints,
        view.gpu_condition,
        view.labels.get(HEALTH_STATE),
        view.labels.get(UPGRADE_STATE),
        view.unschedulable,
        view.ready,
    )


@dataclass
class HealthPassReport(NodePass):
    """What one pass wrote (for logs and tests)."""

    taints: int = 0
    steps: int = 0
    waiting: bool = False


class HealthUnit(UnitBase):
    name = "gpu health"
    pacing = Pacing.IDLE_FIRST

    def __init__(
        self,
        nodes: Callable[[], Iterable[NodeView]],
        node: Callable[[str], NodeView | None],
        policy: Callable[[], HealthSpec | None],
        kube: Kube,
        *,
        settings: OperatorSettings | None = None,
        clock: Callable[[], float] = time.time,
        device_taints: DeviceTaints | None = None,
        runtime: Callable[[], RuntimeAccess] = RuntimeAccess,
        namespace: str = "gpu-operator",
    ) -> None:
        self.nodes, self.node, self.policy, self.kube = nodes, node, policy, kube
        self.runtime = runtime  # how pods reach GPUs besides requests and claims (the drain's)
        self.device_taints = device_taints
        self.settings = settings or OperatorSettings()
        self.clock = clock
        self.executor = Executor(kube, namespace)  # the requests Secret lives in the operator's namespace
        self.queue = NodeQueue(_watched)
        self._everything = True  # the first pass looks at every node
        self._states: dict[str, str] = {}  # node -> metric state last exported

    # -- the queue

    def wants(self, event: Event) -> bool:
        if isinstance(event, NodeEvent):
            if self.queue.changed(event):
                return True
            if event.view is None:  # a node gone: its metric and DRA rules go too
                self.queue.dirty.add(event.name)
                return True
            return False
        if isinstance(event, ObjectEvent) and event.of(CLUSTER_POLICY, GPU_CLUSTER):
            self._everything = True
            return True
        if isinstance(event, ObjectEvent) and event.kind is EventKind.DRIVER_POD and event.node:
            self.queue.dirty.add(event.node)  # remediation waits for a driver pod to come back
            return True
        return False

    def failed(self, err: BaseException) -> None:
        self._everything = True

    # -- one pass

    async def reconcile(self) -> Result:
        spec = self.policy()
        everything, names = self._everything, self.queue.take()
        self._everything = False
        report = HealthPassReport()
        if spec is None:
            self._forget_all()
            return report
        views = (
            {v.name: v for v in self.nodes()}
            if everything or spec.remediation.enabled
            else {n: v for n in names if (v := self.node(n)) is not None}
        )
        look = set(views) if everything else names
        for name in look - set(views):
            self._export(name, None)
        if self.device_taints is not None:  # the rules of nodes that are gone
            for name in sorted(
                (look - set(views)) | (await self.device_taints.pools() - set(views) if everything else set())
            ):
                await self.device_taints.node(name, None, gone=True)
        reports = {n: report_of(v) for n, v in views.items()}  # the only parse of each report this pass
        now = self.clock()
        plan = await self._plan(views, reports, spec, now)
        steps = {s.node: s for s in plan.steps}
        look |= set(steps)

        async def one(name: str) -> None:
            view = views.get(name)
            if view is None:
                return
            await self._node(view, reports[name], spec, steps.get(name), report)
            # DRA: after the node's own signals, so that a refused rule never holds them up
            if self.device_taints is not None and await self.device_taints.node(name, reports[name].report):
                report.waiting = True  # a sick GPU its DRA driver has not published yet
                self.queue.dirty.add(name)

        await self.queue.each(
            look, self.settings.health_concurrency, one, report, "GPU health write failed", log
        )
        report.looked = len(look)
        if report.failed:
            report.requeue = self.settings.health_retry
        elif plan.busy or report.waiting:
            report.requeue = self.settings.health_poll
        return report

    async def _plan(
        self, views: Mapping[str, NodeView], reports: Mapping[str, NodeReport], spec: HealthSpec, now: float
    ) -> hm.RemediationPlan:
        """The remediation machine's steps (nodes it holds released when it is off)."""
        if not spec.remediation.enabled:
            return hm.release_all(
                [hm.node_facts(v, reports[n].report) for n, v in views.items() if v.labels.get(HEALTH_STATE)],
                spec.remediation,
            )
        draining = [n for n, v in views.items() if v.labels.get(HEALTH_STATE) == hm.DRAINING]
        access = self.runtime() if draining else None
        pods = dict(
            zip(
                draining,
                await asyncio.gather(
                    *(self.executor.pod_facts(n, spec.remediation.podSelector, access) for n in draining)
                ),
                strict=True,
            )
        )
        # nodes whose GPU clients are paused for a reset: which of their pods are still there
        pausing = [
            n
            for n, v in views.items()
            if v.labels.get(HEALTH_STATE) == hm.ACTING and hm.PAUSED in v.annotations
        ]
        clients = dict(
            zip(pausing, await asyncio.gather(*(self.executor.gpu_clients(n) for n in pausing)), strict=True)
        )
        return hm.plan(
            [
                hm.node_facts(v, reports[n].report, pods.get(n, ()), clients.get(n, ()))
                for n, v in views.items()
            ],
            spec.remediation,
            now,
        )

    async def _node(
        self,
        view: NodeView,
        node_report: NodeReport,
        spec: HealthSpec,
        step: hm.RemediationStep | None,
        report: HealthPassReport,
    ) -> None:
        facts = facts_of(view, node_report)
        if step is not None and not step.empty:
            await self.executor.run(step)
            report.steps += 1
            if step.result:
                REMEDIATIONS.labels(view.name, step.result).inc()
            # the signals follow what the step wrote just now, not the view read before it
            facts = facts_of(view, node_report, "" if step.remove_state else step.state, step.notes)
        desired = hr.desire(facts, spec)
        writes = hr.writes(facts, desired, spec)
        self._export(view.name, desired.state)
        if writes.empty:
            return
        if (cond := writes.condition) is not None:
            await nodestatus.set_condition(
                self.kube,
                view.name,
                HEALTH_CONDITION,
                cond.status,
                cond.reason,
                cond.message,
                moved=facts.condition is None or facts.condition.status != cond.status,
            )
            report.conditions += 1
        elif writes.delete_condition:
            await nodestatus.delete_condition(self.kube, view.name, HEALTH_CONDITION)
            report.conditions += 1
        if writes.taints is not None:
            keys, want = hr.managed(spec), writes.taints
            if await nodestatus.update_taints(
                self.kube, view.name, lambda cur: hr.merged_taints(cur, keys, want)
            ):
                report.taints += 1
        if writes.event is not None:
            warning, message = writes.event
            log.info("node %s: %s", view.name, message)
            await self.kube.node_event(view.name, HEALTH_EVENT_REASON, message, warning=warning)
            report.events += 1

    # -- metrics

    def _export(self, node: str, state: str | None) -> None:
        before = self._states.get(node)
        if before == state:
            return
        if state is None:
            del self._states[node]  # (before is not None here: it differs from state)
            for s in hr.METRIC_STATES:
                NODE_HEALTH.remove(node, s)
            return
        self._states[node] = state
        for s in hr.METRIC_STATES:
            NODE_HEALTH.labels(node, s).set(1 if s == state else 0)

    def _forget_all(self) -> None:
        for node in list(self._states):
            self._export(node, None)
