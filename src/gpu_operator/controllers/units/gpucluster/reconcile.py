"""The GPUCluster reconcile: NVIDIA's DRA stack for the cluster's one GPUCluster (`gpu-cluster`).

One pass: a GPUCluster being deleted is torn down in order (the DaemonSets whose pods hold
ResourceClaims first, with foreground deletion, then the finalizer goes and the garbage collector
removes the rest, the DRA kubelet plugin last: pods whose claims the plugin must unprepare would
otherwise hang in Terminating); otherwise the finalizer is ensured, a ClusterPolicy beside it stops
everything (both report the conflict), the operator namespace is allowed admin-access claims, the
four states are rendered and applied with the ClusterPolicy's apply/delete contract (so objects of
a switched-off feature are deleted), and status says which state is not ready. With compute domains
on, the ComputeDomain CRDs may be another Helm release's (NVIDIA's DRA driver chart ships them too;
the CRD hook leaves them, kube/crdowners.py): the stack works with that copy when it serves what the
DRA driver needs, and status names what it lacks when it does not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator import vocabulary as vocab
from gpu_operator.api.gpucluster import KIND, SINGLETON, VERSION
from gpu_operator.controllers import status as st
from gpu_operator.controllers.apply import Applied, Applier, owner_reference
from gpu_operator.controllers.environment import operator_env_now
from gpu_operator.controllers.queries import active_policy, validation_message
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.views import GPUClusterView, OwnedKey, OwnedView, object_key
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.kube.crdowners import LeftCRD, owned_elsewhere
from gpu_operator.render import RenderError
from gpu_operator.render.dra import RESOURCE_API_VERSIONS, DRAFacts, render_gpucluster
from gpu_operator.render.result import RenderResult

log = logging.getLogger("gpu_operator.gpucluster")

API_VERSION = f"nvidia.com/{VERSION}"
FINALIZER = "gpucluster.nvidia.com/dra-resourceclaim"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
DRAINING = "DrainingClaimConsumers"
RESOURCE_GROUP = "resource.k8s.io"
COMPUTE_DOMAIN_CRDS = ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com")


def served_resource_api(versions: Iterable[str]) -> str | None:
    """The resource.k8s.io version to use among those serving DeviceClass: v1, then v1beta2, v1beta1."""
    served = {f"{RESOURCE_GROUP}/{v}" for v in versions}
    return next((v for v in RESOURCE_API_VERSIONS if v in served), None)


@dataclass
class ClusterReport(Applied):
    outcome: st.ReconcileOutcome | None = None
    not_ready: list[str] = field(default_factory=list)
    draining: list[str] = field(default_factory=list)


class GPUClusterReconciler:
    def __init__(
        self, kube: Kube, settings: OperatorSettings | None = None, images: Mapping[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings or OperatorSettings()
        self.images = dict(images) if images is not None else operator_env_now()  # read once
        self.applier = Applier(kube)
        self.resource_api: str | None = None  # found by discovery; looked up again while None
        self._namespace_labelled = False
        self._verified = 0.0  # when the unwatched objects (DeviceClasses, the policy...) were last read back
        self._crds_read: float | None = None  # when the ComputeDomain CRDs' owners were last read
        self._crds_left: list[LeftCRD] = []

    async def reconcile(self, snap: ReadSnapshot) -> ClusterReport:
        report = ClusterReport()
        self.applier.forget_others({v.uid for v in snap.gpuclusters})
        view = next((v for v in snap.gpuclusters if v.name == SINGLETON), None)
        if view is None:
            return report  # the CRD's CEL rule admits no other name
        if view.body.get("metadata", {}).get("deletionTimestamp"):
            return await self._teardown(view, snap, report)
        await self._ensure_finalizer(view)
        policy = active_policy(snap.policies)
        if policy is not None:
            report.requeue = self.settings.requeue_conflict
            return await self._finish(
                view,
                snap,
                report,
                st.ReconcileOutcome(
                    vocab.NOT_READY, vocab.PREREQUISITE_NOT_MET, st.conflict_message(view.name, policy.name)
                ),
            )
        parsed = view.parsed
        if parsed.error is not None:
            return await self._finish(
                view,
                snap,
                report,
                st.ReconcileOutcome.failed(validation_message(parsed.error, f"GPUCluster {view.name}")),
            )
        try:
            facts = DRAFacts(
                namespace=snap.namespace,
                resource_api=await self._resource_api(),
                openshift=snap.info.openshift,
                operator_env=self.images,
            )
            result = render_gpucluster(parsed.valid(), facts)
        except RenderError as err:
            return await self._finish(
                view,
                snap,
                report,
                st.ReconcileOutcome.failed(
                    f"{err} (fix the field in GPUCluster {view.name})"
                    if err.field_path.startswith("spec")
                    else str(err)
                ),
            )
        try:
            await self._allow_admin_access(snap.namespace)
            await self._verify_unwatched(view)
            await self.applier.apply(
                result, view, owner_reference(view, API_VERSION, KIND), snap.owned, snap.watched_kinds, report
            )
        except ApiError as err:
            return await self._finish(
                view,
                snap,
                report,
                st.ReconcileOutcome.failed(
                    f"Failed to reconcile GPUCluster {view.name}: {err.status.message}"
                ),
            )
        report.not_ready = not_ready_states(result, snap.owned, report.applied)
        spec = parsed.valid().spec
        compute_domains = spec is not None and spec.draDriver.compute_domains_on()
        lacking = [crd for crd in await self._crds_of_others(compute_domains) if not crd.compatible]
        if lacking:
            outcome = st.ReconcileOutcome(
                vocab.NOT_READY, vocab.PREREQUISITE_NOT_MET, "; ".join(crd.sentence() for crd in lacking)
            )
        elif report.not_ready:
            outcome = st.ReconcileOutcome(
                vocab.NOT_READY,
                vocab.OPERAND_NOT_READY,
                f"Waiting for operand pods to be ready; states not ready: {st.listed(report.not_ready)}",
            )
        else:
            outcome = st.ReconcileOutcome(
                vocab.READY,
                vocab.RECONCILED,
                "GPUCluster is ready: every DRA operand is reconciled and its pods are ready",
            )
            report.requeue = self.settings.gpucluster_resync  # unwatched objects are read back then
        return await self._finish(view, snap, report, outcome)

    async def _verify_unwatched(self, view: GPUClusterView) -> None:
        """DeviceClasses, the admission policy and claim templates are not watched: at most every
        `gpucluster_resync` seconds they are read back, and one deleted or changed is applied again."""
        now = time.monotonic()
        if now - self._verified < self.settings.gpucluster_resync:
            return
        self._verified = now
        for what in await self.applier.verify_remembered(view.uid):
            log.info(
                "GPUCluster %s: %s was deleted or changed by someone else; applying it again", view.name, what
            )

    async def _crds_of_others(self, compute_domains: bool) -> list[LeftCRD]:
        """The ComputeDomain CRDs another Helm release owns (none while compute domains are off):
        read at the first pass, again every `gpucluster_resync` seconds, and every pass while one
        lacks what the DRA driver needs (so a fixed one is seen at the next requeue)."""
        if not compute_domains:
            return []
        now = time.monotonic()
        if (
            self._crds_read is None
            or now - self._crds_read >= self.settings.gpucluster_resync
            or any(not crd.compatible for crd in self._crds_left)
        ):
            left = await owned_elsewhere(self.kube, COMPUTE_DOMAIN_CRDS)
            for crd in set(left) - set(self._crds_left):
                (log.info if crd.compatible else log.warning)("DRA stack: %s", crd.sentence())
            self._crds_left, self._crds_read = left, now
        return self._crds_left

    async def _resource_api(self) -> str | None:
        if self.resource_api is None:
            self.resource_api = served_resource_api(
                await self.kube.served_versions(RESOURCE_GROUP, "DeviceClass")
            )
            if self.resource_api:
                log.info("DRA: the apiserver serves %s", self.resource_api)
        return self.resource_api

    async def _ensure_finalizer(self, view: GPUClusterView) -> None:
        finalizers = list(view.body.get("metadata", {}).get("finalizers") or [])
        if FINALIZER not in finalizers:
            await self.kube.merge_patch(
                API_VERSION, KIND, view.name, {"metadata": {"finalizers": [*finalizers, FINALIZER]}}
            )

    async def _allow_admin_access(self, namespace: str) -> None:
        """The DRA validator's, DCGM's and the exporter's claims ask for admin access, which the
        apiserver grants only in namespaces labelled for it (the label is never removed)."""
        if self._namespace_labelled:
            return
        found = await self.kube.get_dict("v1", "Namespace", namespace)
        if found is not None and (found["metadata"].get("labels") or {}).get(ADMIN_ACCESS_LABEL) != "true":
            await self.kube.merge_patch(
                "v1", "Namespace", namespace, {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}}
            )
            log.info(
                "namespace %s labelled %s=true (admin-access ResourceClaims)", namespace, ADMIN_ACCESS_LABEL
            )
        self._namespace_labelled = True

    async def _teardown(
        self, view: GPUClusterView, snap: ReadSnapshot, report: ClusterReport
    ) -> ClusterReport:
        """Claim-holding DaemonSets first (foreground: until their pods are gone), then the finalizer."""
        holders = sorted(
            (
                v
                for v in snap.owned.values()
                if v.kind == "DaemonSet" and v.claims and view.uid in v.owner_uids
            ),
            key=lambda v: v.name,
        )
        if holders:
            names = [h.name for h in holders]
            report.draining = names
            for holder in (h for h in holders if not h.deleting):
                ref = ObjectKey(holder.api_version, holder.kind, holder.name, holder.namespace)
                if await self.kube.delete(ref, foreground=True):
                    report.deleted.append(str(ref))
            if report.deleted:
                message = (
                    f"deleting DaemonSets whose pods hold ResourceClaims before the DRA kubelet plugin: "
                    f"{', '.join(names)}"
                )
                log.info("GPUCluster %s: %s", view.name, message)
                await self.kube.event(
                    {"apiVersion": API_VERSION, "kind": KIND, "name": view.name, "uid": view.uid},
                    DRAINING,
                    message,
                    warning=False,
                )
            report.requeue = self.settings.requeue_not_ready
            return report
        finalizers = [f for f in view.body.get("metadata", {}).get("finalizers") or [] if f != FINALIZER]
        if FINALIZER in (view.body.get("metadata", {}).get("finalizers") or []):
            log.info(
                "GPUCluster %s: no claim-holding pods left; finalizer removed, the garbage collector "
                "removes the rest (the DRA kubelet plugin with it)",
                view.name,
            )
            try:
                await self.kube.merge_patch(
                    API_VERSION, KIND, view.name, {"metadata": {"finalizers": finalizers}}
                )
            except ApiError as err:
                if err.status.code != 404:
                    raise
        return report

    async def _finish(
        self, view: GPUClusterView, snap: ReadSnapshot, report: ClusterReport, outcome: st.ReconcileOutcome
    ) -> ClusterReport:
        report.outcome = outcome
        wanted = st.status_body(outcome, snap.namespace, view.status, view.generation)
        current = {k: view.status.get(k) for k in ("state", "namespace", "conditions")}
        if st.status_differs(current, wanted):
            log.info("GPUCluster %s: %s (%s) %s", view.name, outcome.state, outcome.reason, outcome.message)
            try:
                await self.kube.patch_status(KIND, view.name, wanted)
            except ApiError as err:
                if err.status.code != 404:
                    raise
        if outcome.state == vocab.NOT_READY and report.requeue is None:
            report.requeue = self.settings.requeue_not_ready
        return report


def not_ready_states(
    result: RenderResult, owned: Mapping[OwnedKey, OwnedView], applied: list[str]
) -> list[str]:
    """States whose DaemonSets or Deployment are not ready yet (or were changed in this pass)."""
    out = []
    for state in result.states:
        for obj in state.objects:
            kind = obj["kind"]
            if kind not in ("DaemonSet", "Deployment"):
                continue
            meta = obj["metadata"]
            live = owned.get(object_key(obj["apiVersion"], kind, meta.get("namespace"), meta["name"]))
            ready: Any = st.daemonset_ready if kind == "DaemonSet" else st.deployment_ready
            if (
                live is None
                or live.readiness is None
                or str(ObjectKey.of(obj)) in applied
                or not ready(live.readiness)
            ):
                out.append(state.name)
                break
    return out
