# Moved from an integration test module: read lightkube's models as those do (pyproject.toml's
# tests.integration.* rule: a None the apiserver never sends fails loudly, no guard per attribute).
# mypy: disable-error-code="union-attr"
"""KubeVirt for the tests of the KubeVirt sync (tests/integration/test_kubevirt_sync.py): its CRD
(tests/fixtures/kubevirt) and whether the apiserver has it, serves it or is still deleting it, the
permitted host devices of its CR, the entries ours and a user's list, and the node facts (the probe's
GPUs, annotations) and ClusterPolicy condition the sync acts on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from tests.support.status import condition, policy_status
from tests.support.waiting import wait_for

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "kubevirt" / "kubevirt.io_kubevirts.yaml"
KubeVirt = create_namespaced_resource("kubevirt.io", "v1", "KubeVirt", "kubevirts")

SEED_001 = ["0a", "18", "3b", "44", "87", "90", "b8", "c1"]
OURS_KUBEVIRT = {
    "pciVendorSelector": "10DE:2330",
    "resourceName": "nvidia.com/H100_SXM5_80GB",
    "externalResourceProvider": False,
}
OURS_SANDBOX = {
    "pciVendorSelector": "10DE:2330",
    "resourceName": "nvidia.com/GH100_H100_SXM5_80GB",
    "externalResourceProvider": True,
}
USER_ENTRY = {"pciVendorSelector": "8086:107C", "resourceName": "kubevirt.io/internet-card"}
PASSTHROUGH = {
    "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough", "mode": "kubevirt"},
    "vfioManager": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": False},
}


def crd_exists(kube: Client) -> bool:
    try:
        kube.get(CustomResourceDefinition, "kubevirts.kubevirt.io")
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise
    return True


def crd_terminating(kube: Client) -> bool:
    try:
        return (
            kube.get(CustomResourceDefinition, "kubevirts.kubevirt.io").metadata.deletionTimestamp is not None
        )
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise


def served(kube: Client) -> bool:
    try:
        list(kube.list(KubeVirt, namespace="*"))
    except ApiError:
        return False
    return True


def kubevirt_dict(kube: Client, namespace: str) -> dict[str, Any]:
    return dict(kube.get(KubeVirt, "kubevirt", namespace=namespace).to_dict())  # type: ignore[no-untyped-call]


def devices(kube: Client, namespace: str) -> list[dict[str, Any]]:
    cr = kubevirt_dict(kube, namespace)
    return list(cr["spec"]["configuration"].get("permittedHostDevices", {}).get("pciHostDevices") or [])


def probe_facts(drivers: dict[str, str]) -> str:
    gpus = [
        {
            "address": f"0000:{b}:00.0",
            "vendorDevice": "10de:2330",
            "name": "GH100 [H100 SXM5 80GB]",
            "product": "H100 SXM5 80GB",
            "driver": d,
        }
        for b, d in sorted(drivers.items())
    ]
    return json.dumps({"driverSource": "none", "gpus": gpus})


def annotate(kube: Client, node: str, annotations: dict[str, str | None]) -> None:
    kube.patch(Node, node, {"metadata": {"annotations": annotations}}, patch_type=PatchType.MERGE)


def vm_condition(kube: Client) -> dict[str, Any]:
    return condition(policy_status(kube), "VMPassthrough")


def apply_crd(kube: Client) -> None:
    """KubeVirt's CRD applied once no earlier one is terminating, and waited for until served."""
    wait_for("no KubeVirt CRD left terminating", lambda: not crd_terminating(kube))
    kube.apply(from_dict(yaml.safe_load(CRD.read_text())), field_manager="tests", force=True)
    wait_for(
        "KubeVirt CRD established",
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in (kube.get(CustomResourceDefinition, "kubevirts.kubevirt.io").status.conditions or [])
        ),
    )
    wait_for("kubevirt.io/v1 served", lambda: served(kube))


def delete_crd(kube: Client) -> None:
    kube.delete(CustomResourceDefinition, "kubevirts.kubevirt.io")
    # the next module applies it again: an apply onto a CRD still terminating lands and then vanishes
    wait_for("KubeVirt CRD deleted", lambda: not crd_exists(kube))


def kubevirt_body(namespace: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The cluster's KubeVirt CR as its user writes it: HostDevices on, their own pciHostDevices."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": namespace},
        "spec": {
            "configuration": {
                "developerConfiguration": {"featureGates": ["HostDevices"]},
                "permittedHostDevices": {"pciHostDevices": entries},
            }
        },
    }
