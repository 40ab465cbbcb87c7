"""`gpu-operator cleanup`, before an uninstall (the chart's pre-delete hook): delete our CRs and
wait for them to go, stop the operator, then run each unit's take-back step in the registry's order
(controllers/units/__init__.py, `take_backs`, by folder: what GPU health and MIG changes wrote on
the nodes, GPU health's DeviceTaintRules, the cordons a driver upgrade in progress set, and last our
node labels and annotations, controllers/cleanup.py, which the operator uses too when the last
ClusterPolicy goes), and with --crds delete our CRDs. It imports no unit's module but through that registry
(tests/unit/controllers/test_units_apart.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from lightkube.core.exceptions import ApiError

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.controllers.cleanup import OWNER_KINDS, Uninstall
from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.controllers.units import take_backs
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.kube.crdowners import other_owner

log = logging.getLogger("gpu_operator.cleanup")


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
            log.warning(
                "kept CRD %s: %d object(s) of it still exist (deleting the CRD would delete them); "
                "delete them first, then the CRD",
                name,
                left,
            )
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
    return [
        p["metadata"]["name"] for p in await kube.list_dicts("v1", "Pod", where.namespace, labels=selector)
    ]


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
            await kube.merge_patch(
                "apps/v1", "Deployment", where.name, {"spec": {"replicas": 0}}, where.namespace
            )
            done.append(f"scaled Deployment {where.namespace}/{where.name} to 0")
        deadline = time.monotonic() + timeout
        while left := await _operator_pods(kube, where, selector):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"operator pod(s) {', '.join(left)} still running {timeout:.0f} s after the "
                    f"scale-down (terminationGracePeriodSeconds?)"
                )
            await asyncio.sleep(0.5)
        done.append("the operator stopped")
    lease = await kube.get_dict("coordination.k8s.io/v1", "Lease", LEASE_NAME, where.namespace)
    if lease is not None:
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") and deployment is None:
            done.append(
                f"kept Lease {where.namespace}/{LEASE_NAME}: held by {spec['holderIdentity']} and no "
                f"Deployment {where.name} to stop"
            )
        elif await kube.delete(ObjectKey("coordination.k8s.io/v1", "Lease", LEASE_NAME, where.namespace)):
            done.append(f"deleted Lease {where.namespace}/{LEASE_NAME}")
    return done


async def cleanup(
    kube: Kube, *, timeout: float = 120.0, crds: bool = False, operator: OperatorDeployment | None = None
) -> list[str]:
    """Delete every GPUCluster, NVIDIADriver and ClusterPolicy (their operands go with them: ownerReferences),
    wait until they are gone; with `operator`, stop the operator (stop_operator); then each unit's
    take-back step, in the registry's order (the nodes listed once for them all); with `crds`,
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
    uninstall = Uninstall(kube, await kube.list_dicts("v1", "Node"), operator.namespace if operator else None)
    for take_back in take_backs():
        done += await take_back(uninstall)
    if crds:
        done += [f"deleted CRD {name}" for name in await delete_crds(kube)]
    return done
