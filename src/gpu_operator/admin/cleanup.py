"""`gpu-operator cleanup`, before an uninstall (the chart's pre-delete hook): delete our CRs and
wait for them to go, stop the operator, uncordon the nodes a driver upgrade in progress had
cordoned, take back what GPU health wrote on the nodes (its condition, its quarantine taint, the
cordon remediation set: controllers/units/health/executor.py; on the DRA stack its DeviceTaintRules:
controllers/units/health/dra.py), take our node labels and annotations back
(controllers/cleanup.py, which the operator uses too when the last ClusterPolicy goes), and with
--crds delete our CRDs."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.controllers.cleanup import OWNER_KINDS, strip_nodes
from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.controllers.units.health.dra import delete_rules
from gpu_operator.controllers.units.health.executor import take_back
from gpu_operator.controllers.units.mig.unit import take_back as take_back_mig
from gpu_operator.controllers.units.upgrade.state import (
    CORDON_REQUIRED,
    UNKNOWN,
    UPGRADE_DONE,
    UPGRADE_REQUIRED,
)
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.kube.crdowners import other_owner
from gpu_operator.vocabulary import (
    HEALTH_REQUESTS_SECRET,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_STATE,
)

log = logging.getLogger("gpu_operator.cleanup")


# Upgrade states in which the node is not (yet, or no longer) cordoned by the upgrade controller.
_NOT_CORDONED_BY_US = frozenset({UNKNOWN, UPGRADE_REQUIRED, CORDON_REQUIRED, UPGRADE_DONE})


def cordoned_by_us(node: dict[str, Any]) -> bool:
    """The driver upgrade controller cordoned this node and has not uncordoned it yet: it is
    unschedulable in a state past cordon-required, and was not unschedulable before the upgrade
    began (the initial-state annotation is not "true"). A node a user cordoned stays cordoned."""
    meta = node.get("metadata") or {}
    state = (meta.get("labels") or {}).get(UPGRADE_STATE, UNKNOWN)
    initially = (meta.get("annotations") or {}).get(UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION)
    return bool((node.get("spec") or {}).get("unschedulable")) and state not in _NOT_CORDONED_BY_US \
        and initially != "true"


async def uncordon_ours(kube: Kube, nodes: list[dict[str, Any]]) -> list[str]:
    """Uncordon the nodes a driver upgrade left cordoned (an uninstall in the middle of one)."""
    done = []
    for node in nodes:
        if not cordoned_by_us(node):
            continue
        name = node["metadata"]["name"]
        try:
            await kube.merge_patch("v1", "Node", name, {"spec": {"unschedulable": False}})
        except ApiError as err:
            if err.status.code == 404:
                continue
            raise
        log.info("node %s: uncordoned (cordoned by a driver upgrade in progress)", name)
        done.append(name)
    return done


async def take_back_health(kube: Kube, nodes: list[dict[str, Any]]) -> list[str]:
    """On every node, what GPU health wrote: the NvidiaGPUReady condition, the quarantine taint,
    and the cordon where remediation set it (before our annotations go: they say whose cordon it
    is); and the MIG unit's NvidiaMIGReady condition. Lines for the log."""
    done = []
    for node in nodes:
        name = node["metadata"]["name"]
        try:
            undone = await take_back(kube, node) + await take_back_mig(kube, node)
        except ApiError as err:
            if err.status.code == 404:
                continue  # the node left meanwhile
            raise
        for what in undone:
            log.info("node %s: %s", name, what)
            done.append(f"node {name}: {what}")
    return done


async def _objects_left(kube: Kube, crd: dict[str, Any]) -> int:
    """How many objects of the CRD's kind exist, in every namespace (0 when its resource is not
    served); counted from a one-item list, not by listing them all."""
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage"))
    return await kube.count_items(spec["group"], version, spec["names"]["plural"]) or 0


async def delete_crds(kube: Kube) -> list[str]:
    """Delete the CRDs this package installs once their objects are gone. A CRD that still has
    objects stays (deleting it would delete them: e.g. a user's ComputeDomains), with a warning;
    one another Helm release owns (NVIDIA's DRA driver chart's ComputeDomain CRDs) is its to delete."""
    deleted = []
    for crd in load_packaged():
        name = crd["metadata"]["name"]
        owner = await kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        if owner is not None and (release := other_owner(owner, None)) is not None:
            log.info("kept CRD %s: Helm release %s owns it (kube/crdowners.py)", name, release)
            continue
        left = await _objects_left(kube, crd)
        if left:
            log.warning("kept CRD %s: %d object(s) of it still exist (deleting the CRD would delete them); "
                        "delete them first, then the CRD", name, left)
            continue
        if await kube.delete(ObjectKey("apiextensions.k8s.io/v1", "CustomResourceDefinition", name, None)):
            log.info("deleted CRD %s", name)
            deleted.append(name)
    return deleted


@dataclass(frozen=True)
class OperatorDeployment:
    """The operator Deployment a pre-delete hook stops before Helm deletes the chart's RBAC."""
    namespace: str
    name: str


async def _operator_pods(kube: Kube, where: OperatorDeployment, selector: dict[str, str]) -> list[str]:
    return [p["metadata"]["name"] for p in await kube.list_dicts("v1", "Pod", where.namespace, labels=selector)]


async def stop_operator(kube: Kube, where: OperatorDeployment, timeout: float) -> list[str]:
    """Scale the operator's Deployment to zero and wait until its pods have exited. The hook runs
    before Helm deletes anything, so the stopping operator still has its RBAC and deletes its own
    Lease (nothing left to lead); Helm deletes the pods' RBAC at once after the hook, and a pod
    still stopping then could not. A Lease nobody renews any more is deleted here."""
    done: list[str] = []
    deployment = await kube.get_dict("apps/v1", "Deployment", where.name, where.namespace)
    if deployment is not None:
        selector = deployment["spec"]["selector"].get("matchLabels") or {}
        if deployment["spec"].get("replicas", 1):
            await kube.merge_patch("apps/v1", "Deployment", where.name, {"spec": {"replicas": 0}}, where.namespace)
            done.append(f"scaled Deployment {where.namespace}/{where.name} to 0")
        deadline = time.monotonic() + timeout
        while left := await _operator_pods(kube, where, selector):
            if time.monotonic() > deadline:
                raise TimeoutError(f"operator pod(s) {', '.join(left)} still running {timeout:.0f} s after the "
                                   f"scale-down (terminationGracePeriodSeconds?)")
            await asyncio.sleep(0.5)
        done.append("the operator stopped")
    lease = await kube.get_dict("coordination.k8s.io/v1", "Lease", LEASE_NAME, where.namespace)
    if lease is not None:
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") and deployment is None:
            done.append(f"kept Lease {where.namespace}/{LEASE_NAME}: held by {spec['holderIdentity']} and no "
                        f"Deployment {where.name} to stop")
        elif await kube.delete(ObjectKey("coordination.k8s.io/v1", "Lease", LEASE_NAME, where.namespace)):
            done.append(f"deleted Lease {where.namespace}/{LEASE_NAME}")
    return done


async def cleanup(kube: Kube, *, timeout: float = 120.0, crds: bool = False,
                  operator: OperatorDeployment | None = None) -> list[str]:
    """Delete every GPUCluster, NVIDIADriver and ClusterPolicy (their operands go with them: ownerReferences),
    wait until they are gone; with `operator`, stop the operator (stop_operator); then uncordon the
    nodes a driver upgrade had cordoned, take back GPU health's condition, taint and cordon, and
    remove our node labels and annotations; with `crds`,
    delete our CRDs last. Lines for the log."""
    done: list[str] = []
    for api_version, kind in OWNER_KINDS:
        try:
            found = await kube.list_dicts(api_version, kind)
        except ApiError as err:
            if err.status.code == 404:
                continue  # the CRD is gone already
            raise
        for obj in found:
            name = obj["metadata"]["name"]
            if await kube.delete(ObjectKey(api_version, kind, name, None)):
                done.append(f"deleted {kind} {name}")
    deadline = time.monotonic() + timeout
    for api_version, kind in OWNER_KINDS:
        while True:
            try:
                left = await kube.list_dicts(api_version, kind)
            except ApiError as err:
                if err.status.code == 404:
                    break
                raise
            if not left:
                break
            if time.monotonic() > deadline:
                names = ", ".join(o["metadata"]["name"] for o in left)
                raise TimeoutError(f"{kind} {names} still there after {timeout:.0f} s (a finalizer?)")
            await asyncio.sleep(0.5)
    if operator is not None:
        done += await stop_operator(kube, operator, timeout)
        # GPU health's remediation requests: the operator made the Secret, so Helm does not delete it
        if await kube.delete(ObjectKey("v1", "Secret", HEALTH_REQUESTS_SECRET, operator.namespace)):
            done.append(f"deleted Secret {operator.namespace}/{HEALTH_REQUESTS_SECRET}")
    nodes = await kube.list_dicts("v1", "Node")
    done += [f"node {name}: uncordoned (a driver upgrade had cordoned it)" for name in await uncordon_ours(kube, nodes)]
    done += await take_back_health(kube, nodes)
    done += [f"deleted DeviceTaintRule {name}" for name in await delete_rules(kube)]
    done += [f"node {name}: our labels and annotations removed" for name in await strip_nodes(kube)]
    if crds:
        done += [f"deleted CRD {name}" for name in await delete_crds(kube)]
    return done
