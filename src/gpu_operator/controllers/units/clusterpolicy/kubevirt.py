"""The KubeVirt sync (thin I/O): read the KubeVirt CR, apply the pciHostDevices list render/kubevirt.py
computes, report findings as the ClusterPolicy's VMPassthrough condition and as Warning events."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube.client import Kube
from gpu_operator.render import kubevirt as kv
from gpu_operator.vocabulary import KUBEVIRT_FIELD_MANAGER

log = logging.getLogger("gpu_operator.kubevirt")

# Registers kubevirt.io/v1 KubeVirt with lightkube (Kube.apply and list find it by apiVersion/kind).
KubeVirtResource = create_namespaced_resource("kubevirt.io", "v1", "KubeVirt", "kubevirts")
CRD_NAME = "kubevirts.kubevirt.io"


@dataclass
class SyncResult:
    condition: dict[str, str] | None = None  # None: sandbox workloads off, no condition
    applied: bool = False
    retry: bool = False  # the CR changed under us (409): look again soon
    findings: list[kv.KubeVirtFinding] = field(default_factory=list)


async def _kubevirt_cr(kube: Kube) -> dict[str, Any] | None | bool:
    """The KubeVirt CR (the oldest if several); None when none exists; False when the API is not served."""
    if await kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition", CRD_NAME) is None:
        return False
    try:
        crs = await kube.list_dicts(kv.API_VERSION, kv.KIND, namespace="*")
    except ApiError as err:  # also a kind the apiserver does not serve (yet): kube/ answers 404 alike
        if err.status.code == 404:
            return False
        raise
    if not crs:
        return None
    return sorted(crs, key=lambda c: (c["metadata"].get("creationTimestamp", ""), c["metadata"]["name"]))[0]


def _inputs(nodes: Iterable[NodeView]) -> list[kv.NodeInput]:
    return [kv.NodeInput(n.name, n.labels, n.annotations) for n in nodes]


async def sync(kube: Kube, policy: ClusterPolicy, nodes: Iterable[NodeView]) -> SyncResult:
    spec = policy.spec
    if not spec.sandbox_on():
        return SyncResult()
    inventory = kv.inventory(_inputs(nodes), spec)
    findings = list(inventory.findings)
    result = SyncResult()
    entries: list[dict[str, Any]] = []
    synced = False
    note = ""
    if not spec.sandboxWorkloads.kubevirt_sync():
        note = (
            "KubeVirt sync off (spec.sandboxWorkloads.kubevirt.syncPermittedHostDevices=false or mode kata)"
        )
    else:
        cr = await _kubevirt_cr(kube)
        if cr is False:
            note = "KubeVirt's API (kubevirt.io/v1 KubeVirt) is not served: nothing to sync"
        elif cr is None:
            note = "no KubeVirt CR exists yet: nothing to sync"
        else:
            assert isinstance(cr, dict)
            desired = kv.desired_entries(inventory.bound, external=spec.sandboxDevicePlugin.on())
            merged = kv.merge(cr, desired)
            findings += merged.findings
            entries = merged.entries
            synced = True
            if merged.changed:
                try:
                    await kube.apply(kv.apply_body(cr, merged), field_manager=KUBEVIRT_FIELD_MANAGER)
                    result.applied = True
                    meta = cr["metadata"]
                    log.info(
                        "KubeVirt %s/%s: pciHostDevices set (ours: %s)",
                        meta.get("namespace"),
                        meta["name"],
                        ",".join(merged.ours) or "none",
                    )
                except ApiError as err:
                    if err.status.code != 409:
                        raise
                    result.retry = True  # edited since we read it: the next pass reads it again
    text = kv.summary(inventory, entries) + (f"; {note}" if note else "")
    result.condition = kv.condition(findings, synced, text, inventory.no_facts)
    result.findings = findings
    return result


async def emit(kube: Kube, findings: list[kv.KubeVirtFinding], policy_name: str) -> None:
    """A Warning Event per finding: about its Node, else about the ClusterPolicy."""
    for finding in findings:
        try:
            if finding.node:
                await kube.node_event(finding.node, finding.reason, finding.message)
            else:
                await kube.event(
                    {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": policy_name},
                    finding.reason,
                    finding.message,
                )
        except ApiError as err:
            log.warning("could not record event %s: %s", finding.reason, err.status.message)
