"""The NVIDIADriver reconcile: route GPU nodes to their NVIDIADriver, render each one's pools through
the driver state, apply with the ClusterPolicy's apply/delete contract, report conflicts, write status."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator import vocabulary as vocab
from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.controllers import status as st
from gpu_operator.controllers.apply import Applier, ReconcileReport, owner_reference
from gpu_operator.controllers.environment import operator_env_now
from gpu_operator.controllers.kmodconfig import kernel_module_data
from gpu_operator.controllers.loop import Result
from gpu_operator.controllers.passinputs import ReadOnce, configmap_keys
from gpu_operator.controllers.queries import active_policy, effective_owners, parse_drivers, routing_of
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.views import ClusterPolicyView, NVIDIADriverView, object_key
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.render import ClusterFacts, RenderError
from gpu_operator.render.driverowners import Routing, conflict_message
from gpu_operator.render.facts import has_nfd_gpu_labels as has_gpu
from gpu_operator.render.nvidiadriver import driver_policy, pools_of, render_nvidiadriver
from gpu_operator.vocabulary import DRIVER_OWNER

log = logging.getLogger("gpu_operator.nvidiadriver")

API_VERSION = "nvidia.com/v1alpha1"
KIND = "NVIDIADriver"
DISABLED = "disabled"
# Upstream's condition reasons for NVIDIADriver.
CONFLICTING_NODE_SELECTOR = "ConflictingNodeSelector"
DRIVER_NOT_READY = "DriverNotReady"
PREREQUISITE_NOT_MET = vocab.PREREQUISITE_NOT_MET


@dataclass
class DriverReport(Result):
    reports: dict[str, ReconcileReport] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


class NVIDIADriverReconciler:
    def __init__(
        self, kube: Kube, settings: OperatorSettings | None = None, images: Mapping[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings or OperatorSettings()
        self.images = dict(images) if images is not None else operator_env_now()  # read once
        self.applier = Applier(kube)
        self.reported: set[tuple[str, tuple[str, ...]]] = set()  # conflicts already sent as events

    async def reconcile(self, snap: ReadSnapshot) -> DriverReport:
        out = DriverReport()
        if not snap.drivers:
            return out
        views = {v.name: v for v in snap.drivers}
        self.applier.forget_others({v.uid for v in snap.drivers})
        drivers, invalid = parse_drivers(snap.drivers)
        for name, message in invalid.items():
            await self._status(views[name], snap, st.ReconcileOutcome.failed(message))
        active = active_policy(snap.policies)
        policy = active.parsed.model if active is not None else None
        if active is not None and policy is None:
            # the ClusterPolicy reports its own error (naming the field); its drivers stay as they
            # are until it is valid again: a typo in the policy must not remove driver pools
            return out
        dra = active is None and bool(snap.gpuclusters)  # the DRA stack's driver (host root /)
        if not dra and (policy is None or not policy.spec.driver.useNvidiaDriverCRD):
            for name in drivers:
                await self._disabled(views[name], snap, active)
            return out
        routing = routing_of(drivers.values(), snap.nodes)
        await self._conflict_events(routing, out)
        owners = effective_owners(routing, snap.nodes)
        base = policy
        facts = ClusterFacts.of(
            [n.facts for n in snap.nodes],
            namespace=snap.namespace,
            k8s_version=snap.info.k8s_version,
            operator_env=self.images,
            openshift=snap.info.openshift,
            openshift_version=snap.info.openshift_version,
        )
        for name, nvd in sorted(drivers.items()):
            report = ReconcileReport()
            out.reports[name] = report
            outcome = await self._one(nvd, views[name], base, facts, owners, routing, snap, report)
            report.outcome = outcome
            await self._status(views[name], snap, outcome)
            if outcome.state != vocab.READY:
                out.requeue = self.settings.requeue_not_ready
        return out

    async def _one(
        self,
        nvd: NVIDIADriver,
        view: NVIDIADriverView,
        base: ClusterPolicy | None,
        facts: ClusterFacts,
        owners: dict[str, str],
        routing: Routing,
        snap: ReadSnapshot,
        report: ReconcileReport,
    ) -> st.ReconcileOutcome:
        name = nvd.metadata.name
        owned_nodes = sorted(node for node, owner in owners.items() if owner == name)
        conflict = "; ".join(
            conflict_message(node, names) for node, names in routing.conflicts_of(name).items()
        )

        def failed(message: str) -> st.ReconcileOutcome:
            # As upstream, a conflicting nodeSelector is what the status names first, whatever
            # else fails: which one a user sees must not depend on which CR the watch saw first.
            if conflict:
                return st.ReconcileOutcome(
                    vocab.NOT_READY, CONFLICTING_NODE_SELECTOR, f"{conflict}; also: {message}"
                )
            return st.ReconcileOutcome.failed(message)

        try:
            policy, reads = driver_policy(nvd, base), ReadOnce(self.kube)  # each user ConfigMap GET once
            keys = await configmap_keys(reads, policy, snap.namespace)
            # its VM guests' merged kernel-module ConfigMap (render/guestnvlink.py): the CR's content
            owned_facts = [n.facts for n in snap.nodes if owners.get(n.name) == name]
            data = await kernel_module_data(reads, policy, snap.namespace, owned_facts)
            result = render_nvidiadriver(
                nvd,
                dataclasses.replace(facts, configmap_keys=keys, configmap_data=data),
                base,
                owned=owned_nodes,
            )
        except RenderError as err:
            return failed(f"{err} (fix the field in NVIDIADriver {name})")
        try:
            await self.applier.apply(
                result, view, owner_reference(view, API_VERSION, KIND), snap.owned, snap.watched_kinds, report
            )
        except ApiError as err:
            return failed(f"Failed to reconcile NVIDIADriver {name}: {err.status.message}")
        if conflict:
            return st.ReconcileOutcome(vocab.NOT_READY, CONFLICTING_NODE_SELECTOR, conflict)
        not_ready = []
        for pool in pools_of(result):
            for ds in pool.objects:
                meta = ds["metadata"]
                live = snap.owned.get(
                    object_key(ds["apiVersion"], "DaemonSet", meta.get("namespace"), meta["name"])
                )
                if (
                    live is None
                    or live.readiness is None
                    or str(ObjectKey.of(ds)) in report.applied
                    or not st.daemonset_ready(live.readiness)
                ):
                    not_ready.append(meta["name"])
        report.not_ready = not_ready
        labels = {n.name: n.labels for n in snap.nodes}
        unlabelled = [n for n in owned_nodes if labels.get(n, {}).get(DRIVER_OWNER) != name]
        waiting = [n.name for n in snap.nodes if has_gpu(n.labels) and not n.gpu_present]
        if unlabelled or waiting:
            # "ready" now would only mean the DaemonSets have no node to run on yet
            return st.ReconcileOutcome(
                vocab.NOT_READY,
                DRIVER_NOT_READY,
                f"NVIDIADriver {name} is not ready; nodes not labelled yet: {unlabelled or waiting}",
            )
        if not_ready:
            return st.ReconcileOutcome(
                vocab.NOT_READY,
                DRIVER_NOT_READY,
                f"NVIDIADriver {name} is not ready; driver DaemonSets not ready: {not_ready}",
            )
        if not owned_nodes:
            selector = ", ".join(f"{k}={v}" for k, v in sorted((nvd.spec.nodeSelector or {}).items()))
            what = f"nodeSelector ({selector})" if selector else "this default NVIDIADriver"
            return st.ReconcileOutcome(
                vocab.READY,
                vocab.NO_GPU_NODES,
                f"NVIDIADriver {name}: {what} matches no GPU node (that no other NVIDIADriver "
                "selects); no driver DaemonSet is deployed",
            )
        return st.ReconcileOutcome(
            vocab.READY,
            vocab.RECONCILED,
            f"NVIDIADriver {name} is ready: {len(owned_nodes)} node(s) in {len(pools_of(result))} pool(s)",
        )

    async def _conflict_events(self, routing: Routing, out: DriverReport) -> None:
        """One Warning Event per node and set of claimants (not one per reconcile)."""
        current = set(routing.conflicts.items())
        for node, names in sorted(current - self.reported):
            message = conflict_message(node, names)
            log.warning("%s", message)
            try:
                await self.kube.node_event(node, CONFLICTING_NODE_SELECTOR, message)
            except ApiError as err:
                log.warning("node %s: event not recorded: %s", node, err.status.message)
                continue
            out.events.append(node)
            self.reported.add((node, names))
        self.reported &= current

    async def _disabled(
        self, view: NVIDIADriverView, snap: ReadSnapshot, active: ClusterPolicyView | None
    ) -> None:
        if active is None:
            outcome = st.ReconcileOutcome(
                vocab.NOT_READY,
                PREREQUISITE_NOT_MET,
                "no ClusterPolicy and no GPUCluster: create a ClusterPolicy with "
                "spec.driver.useNvidiaDriverCRD=true, or a GPUCluster (the DRA stack)",
            )
            await self._status(view, snap, outcome)
            return
        message = (
            f"ClusterPolicy {active.name} has spec.driver.useNvidiaDriverCRD=false: set it to true to let "
            "NVIDIADrivers manage the driver"
        )
        wanted = st.status_body(
            st.ReconcileOutcome(vocab.NOT_READY, PREREQUISITE_NOT_MET, message),
            snap.namespace,
            view.status,
            view.generation,
        )
        wanted["state"] = DISABLED
        await self._write(view, wanted)

    async def _status(self, view: NVIDIADriverView, snap: ReadSnapshot, outcome: st.ReconcileOutcome) -> None:
        await self._write(view, st.status_body(outcome, snap.namespace, view.status, view.generation))

    async def _write(self, view: NVIDIADriverView, wanted: dict[str, Any]) -> None:
        current = {k: view.status.get(k) for k in ("state", "namespace", "conditions")}
        if not st.status_differs(current, wanted):
            return
        conditions = wanted.get("conditions") or [{}]
        log.info(
            "NVIDIADriver %s: %s (%s) %s",
            view.name,
            wanted["state"],
            conditions[-1].get("reason"),
            conditions[-1].get("message"),
        )
        try:
            await self.kube.patch_status("NVIDIADriver", view.name, wanted)
        except ApiError as err:
            if err.status.code != 404:
                raise
