"""ClusterPolicy readiness and status: DaemonSet readiness and the paired Ready/Error conditions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.vocabulary import (
    DRIVER_OWNER,
    NFD_LABELS_MISSING,
    NO_GPU_NODES,
    NOT_READY,
    OPERAND_NOT_READY,
    READY,
    RECONCILE_FAILED,
    RECONCILED,
    UNKNOWN,
    UPGRADE_DONE,
    UPGRADE_SKIP,
    UPGRADE_STATE,
)

# Upstream's two reasons (controllers/clusterpolicy_controller.go, v26.7.0) appended to the not
# ready message while an NVIDIADriver's upgrade has not completed.
UPGRADE_INCOMPLETE = (
    "NVIDIADriver upgrade has not completed",
    "one or more NVIDIADriver-owned Nodes are marked pending, in-progress, or failed",
)


def daemonset_ready(ds: dict[str, Any]) -> bool:
    """Readiness of a DaemonSet the way upstream judges a RollingUpdate one. For OnDelete (the
    driver) upstream compares pods' revision hashes; updatedNumberScheduled counts exactly the
    pods on the latest revision, so the same rule covers it without listing pods."""
    status = ds.get("status") or {}
    generation = ds.get("metadata", {}).get("generation", 0)
    if status.get("observedGeneration", 0) < generation:
        # The DaemonSet controller has not looked at this spec yet: its counts (often all
        # zero for a new DaemonSet) say nothing. Upstream would call a fresh one ready here.
        return False
    desired = status.get("desiredNumberScheduled", 0)
    if desired == 0:
        return True
    if status.get("numberUnavailable", 0):
        return False
    return bool(
        status.get("updatedNumberScheduled", 0) == desired and status.get("numberAvailable", 0) == desired
    )


def deployment_ready(deployment: dict[str, Any]) -> bool:
    """Upstream's rule: the Deployment controller has seen this spec, and every replica is updated
    and available."""
    status = deployment.get("status") or {}
    if status.get("observedGeneration", 0) < deployment.get("metadata", {}).get("generation", 0):
        return False
    replicas = status.get("replicas", 0)
    return bool(
        replicas and status.get("updatedReplicas", 0) == replicas == status.get("availableReplicas", 0)
    )


def conflict_message(cluster: str, policy: str) -> str:
    """Both CRs' status when a GPUCluster and a ClusterPolicy are there together."""
    return (
        f"GPUCluster {cluster} and ClusterPolicy {policy} cannot co-exist: the cluster runs either the DRA "
        f"stack (GPUCluster) or the device-plugin stack (ClusterPolicy). Delete one of them "
        f"(`kubectl delete clusterpolicy {policy}` or `kubectl delete gpucluster {cluster}`); nothing is "
        "applied for either until then"
    )


@dataclass(frozen=True)
class ReconcileOutcome:
    """The result of one reconcile, before it is written as status."""

    state: str  # ready | notReady | ignored
    reason: str
    message: str
    # False: nothing here changes without an event the operator watches (a node's labels), so a
    # not ready outcome is not looked at again on a timer (upstream does not requeue for it either).
    poll: bool = True

    @classmethod
    def failed(cls, message: str) -> ReconcileOutcome:
        return cls(NOT_READY, RECONCILE_FAILED, message)


def listed(names: list[str]) -> str:
    """A list of names as upstream's messages print one (Go's %v of a []string): [a b]."""
    return f"[{' '.join(names)}]"


def upgrade_incomplete(use_nvidia_driver_crd: bool | None, node_labels: Iterable[Mapping[str, str]]) -> bool:
    """Upstream's rule for a ClusterPolicy with `driver.useNvidiaDriverCRD` (without it, never): a node carrying an
    NVIDIADriver owner label, not marked to skip upgrades (`nvidia.com/gpu-driver-upgrade.skip=true`),
    whose upgrade state is anything but none or `upgrade-done` (pending, under way or
    `upgrade-failed`) keeps the driver rollout incomplete. Nodes without the owner label (the
    ClusterPolicy's own driver) never count."""
    return bool(use_nvidia_driver_crd) and any(
        DRIVER_OWNER in labels
        and labels.get(UPGRADE_SKIP) != "true"
        and labels.get(UPGRADE_STATE, UNKNOWN) not in (UNKNOWN, UPGRADE_DONE)
        for labels in node_labels
    )


def outcome(
    not_ready_states: list[str],
    has_nfd: bool,
    has_gpu_nodes: bool,
    unlabelled_gpu_nodes: int = 0,
    upgrading: bool = False,
) -> ReconcileOutcome:
    """`upgrading`: `upgrade_incomplete` of the nodes, for a policy with `driver.useNvidiaDriverCRD`."""
    if not_ready_states or upgrading:
        # Upstream's message, its list as Go prints a []string, then the upgrade's reasons. The
        # states come first: a node that has just joined is unlabelled for a moment, and reporting
        # that instead would flip the message (and write the status) on every reconcile while
        # nodes join during a rollout. Upgrade states change by node label events, which kick a
        # reconcile: only not ready states are polled.
        parts = ["ClusterPolicy is not ready"]
        if not_ready_states:
            parts.append(f"states not ready: {listed(not_ready_states)}")
        if upgrading:
            parts.extend(UPGRADE_INCOMPLETE)
        return ReconcileOutcome(NOT_READY, OPERAND_NOT_READY, "; ".join(parts), poll=bool(not_ready_states))
    if unlabelled_gpu_nodes:
        # NFD found GPUs the labeller has not marked yet: "ready, no GPU nodes" would be a lie
        # that lasts a moment and fools anyone waiting for ready.
        return ReconcileOutcome(
            NOT_READY,
            OPERAND_NOT_READY,
            f"ClusterPolicy is not ready; {unlabelled_gpu_nodes} GPU node(s) not labelled "
            "nvidia.com/gpu.present yet",
        )
    if not has_nfd:
        return ReconcileOutcome(
            READY,
            NFD_LABELS_MISSING,
            "No NFD labels found: install the chart with nfd.enabled=true (its node-discovery "
            "DaemonSet writes them), deploy node-feature-discovery, or label GPU nodes with "
            "feature.node.kubernetes.io/pci-10de.present=true",
        )
    if not has_gpu_nodes:
        return ReconcileOutcome(
            READY, NO_GPU_NODES, "No GPU node found, watching for new nodes to join the cluster"
        )
    return ReconcileOutcome(
        READY, RECONCILED, "ClusterPolicy is ready as all resources have been successfully reconciled"
    )


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions(
    result: ReconcileOutcome,
    previous: list[dict[str, Any]],
    generation: int,
    extra: list[dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """The Ready/Error pair for `result` (then `extra` conditions, e.g. VMPassthrough); a condition
    that did not change keeps its lastTransitionTime, so an unchanged outcome yields identical
    conditions (and no write)."""
    ok = result.state == READY
    wanted = [
        {
            "type": "Ready",
            "status": "True" if ok else "False",
            "reason": result.reason if ok else "Error",
            "message": result.message if ok else "",
        },
        {
            "type": "Error",
            "status": "False" if ok else "True",
            "reason": "Ready" if ok else result.reason,
            "message": "" if ok else result.message,
        },
        *(extra or []),
    ]
    by_type = {c.get("type"): c for c in previous}
    out = []
    for cond in wanted:
        old = by_type.get(cond["type"], {})
        unchanged_status = old.get("status") == cond["status"]
        out.append(
            {
                **cond,
                "observedGeneration": generation,
                "lastTransitionTime": old["lastTransitionTime"]
                if unchanged_status and old.get("lastTransitionTime")
                else _now(),
            }
        )
    return out


def status_body(
    result: ReconcileOutcome,
    namespace: str,
    previous: dict[str, Any] | None,
    generation: int,
    extra: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    prev = previous or {}
    return {
        "state": result.state,
        "namespace": namespace,
        "conditions": conditions(result, prev.get("conditions") or [], generation, extra),
    }


def status_differs(current: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    return (current or {}) != wanted


def _error_reason(status: dict[str, Any]) -> str | None:
    return next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Error"), None)


def message_only(current: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Both not ready because operands are (OperandNotReady), in the same namespace: only which
    states are not ready differs. (A new error message, a failed reconcile, is never held.)"""
    current = current or {}
    return (
        current.get("state") == wanted.get("state") == NOT_READY
        and current.get("namespace") == wanted.get("namespace")
        and _error_reason(current) == _error_reason(wanted) == OPERAND_NOT_READY
    )
