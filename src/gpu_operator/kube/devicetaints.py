"""Typed DRA calls GPU health needs on the DRA stack: whether the apiserver serves DeviceTaintRule,
the DeviceTaintRules we keep (listed by label, created, deleted) and one node's ResourceSlices of a
driver (to name a GPU as its DRA driver publishes it).

DeviceTaintRule is GA in Kubernetes 1.37: served as resource.k8s.io/v1 by default (feature gate
DRADeviceTaintRules GA, on). Kubernetes 1.36 serves it as resource.k8s.io/v1beta2 only, off unless
the apiserver enables it (`--runtime-config=resource.k8s.io/v1beta2=true`), and the scheduler
honours the rules only with the gate DRADeviceTaintRules (beta in 1.36, off by default). Both
versions have the same fields; we use the newest the apiserver serves, looked up by discovery
(`rule_version`). Sources in docs/health.md (DRA).
"""

from __future__ import annotations

import json
from typing import Any

from gpu_operator.kube.client import Kube
from gpu_operator.kube.resources import ObjectKey, collection_path

GROUP = "resource.k8s.io"
RULE_VERSIONS = ("v1", "v1beta2")  # DeviceTaintRule, newest first: GA in 1.37, beta (off by default) in 1.36
RULES = "devicetaintrules"
SLICE_VERSION = "v1"  # ResourceSlice, served from Kubernetes 1.34 on
SLICES = "resourceslices"
KIND = "DeviceTaintRule"


async def rule_version(kube: Kube) -> str | None:
    """The version of DeviceTaintRule to use: the newest of RULE_VERSIONS the apiserver serves; None
    when it serves none of them (or no v1 ResourceSlice, which names the devices)."""
    if SLICE_VERSION not in await kube.served_versions(GROUP, "ResourceSlice"):
        return None
    served = await kube.served_versions(GROUP, KIND)
    return next((version for version in RULE_VERSIONS if version in served), None)


async def list_rules(kube: Kube, version: str, labels: str) -> list[dict[str, Any]]:
    """The DeviceTaintRules matching the label selector string `labels`."""
    return await kube.list_items(GROUP, version, RULES, labels=labels)


async def create_rule(kube: Kube, version: str, body: dict[str, Any]) -> bool:
    """Create one DeviceTaintRule (`body` in `version`); False when one of that name exists already."""
    if body.get("apiVersion") != f"{GROUP}/{version}":
        raise ValueError(f"DeviceTaintRule body is {body.get('apiVersion')!r}, not {GROUP}/{version}")
    kube.write("create", KIND)
    response = await kube.http.post(
        collection_path(GROUP, version, RULES),
        content=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    if response.status_code == 409:
        return False
    response.raise_for_status()
    return True


async def delete_rule(kube: Kube, version: str, name: str) -> bool:
    """Delete one DeviceTaintRule; False when it was gone already."""
    return await kube.delete(ObjectKey(f"{GROUP}/{version}", KIND, name))


async def node_slices(kube: Kube, node: str, driver: str) -> list[dict[str, Any]]:
    """The ResourceSlices `driver` publishes for `node`."""
    return await kube.list_items(
        GROUP, SLICE_VERSION, SLICES, fields=f"spec.nodeName={node},spec.driver={driver}"
    )
