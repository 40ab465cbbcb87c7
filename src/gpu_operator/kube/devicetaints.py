"""Typed DRA calls GPU health needs on the DRA stack: whether the apiserver serves DeviceTaintRule,
the DeviceTaintRules we keep (listed by label, created, deleted) and one node's ResourceSlices of a
driver (to name a GPU as its DRA driver publishes it).

DeviceTaintRule is served by Kubernetes 1.36 as resource.k8s.io/v1beta2 only (v1alpha3 is its
alpha version), and v1beta2 of resource.k8s.io is off unless the apiserver enables it
(`--runtime-config=resource.k8s.io/v1beta2=true`); the scheduler honours the rules only with its
feature gate DRADeviceTaintRules (beta in 1.36, off by default). Sources in docs/health.md (DRA).
"""

from __future__ import annotations

import json
from typing import Any

from gpu_operator.kube.client import Kube
from gpu_operator.kube.resources import ObjectKey, collection_path

GROUP = "resource.k8s.io"
RULE_VERSION = "v1beta2"  # the one version of DeviceTaintRule we write (Kubernetes 1.36)
RULES = "devicetaintrules"
SLICE_VERSION = "v1"  # ResourceSlice, served from Kubernetes 1.34 on
SLICES = "resourceslices"
KIND = "DeviceTaintRule"


async def rules_served(kube: Kube) -> bool:
    """Whether the apiserver serves DeviceTaintRule in the version we write (and v1 slices)."""
    return (RULE_VERSION in await kube.served_versions(GROUP, KIND)
            and SLICE_VERSION in await kube.served_versions(GROUP, "ResourceSlice"))


async def list_rules(kube: Kube, labels: str) -> list[dict[str, Any]]:
    """The DeviceTaintRules matching the label selector string `labels`."""
    return await kube.list_items(GROUP, RULE_VERSION, RULES, labels=labels)


async def create_rule(kube: Kube, body: dict[str, Any]) -> bool:
    """Create one DeviceTaintRule; False when one of that name exists already."""
    kube.write("create", KIND)
    response = await kube.http.post(collection_path(GROUP, RULE_VERSION, RULES), content=json.dumps(body),
                                    headers={"Content-Type": "application/json"})
    if response.status_code == 409:
        return False
    response.raise_for_status()
    return True


async def delete_rule(kube: Kube, name: str) -> bool:
    """Delete one DeviceTaintRule; False when it was gone already."""
    return await kube.delete(ObjectKey(f"{GROUP}/{RULE_VERSION}", KIND, name))


async def node_slices(kube: Kube, node: str, driver: str) -> list[dict[str, Any]]:
    """The ResourceSlices `driver` publishes for `node`."""
    return await kube.list_items(GROUP, SLICE_VERSION, SLICES, fields=f"spec.nodeName={node},spec.driver={driver}")
