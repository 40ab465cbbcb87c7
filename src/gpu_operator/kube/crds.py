"""Applies the packaged CRDs (server-side apply) and waits until the apiserver serves them: Established,
then a list of each served version answers (not 429). A CRD another Helm release owns is left as it
is (kube/crdowners.py)."""

from __future__ import annotations

import time
from typing import Any

from httpx2 import HTTPStatusError
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from gpu_operator.api.crdgen import load_packaged, node_feature_crd
from gpu_operator.kube.client import FIELD_MANAGER
from gpu_operator.kube.crdowners import LeftCRD, Release, left_crd


def apply_crds(
    client: Client,
    timeout: float = 60.0,
    node_feature: bool = True,
    kept: list[str] | None = None,
    release: Release | None = None,
    left: list[LeftCRD] | None = None,
) -> list[str]:
    """Apply every CRD shipped with the package; returns their names once all are Established.
    `node_feature`: also create NFD's NodeFeature CRD where it is absent (GFD publishes its labels
    there); one that exists (NFD's, or ours from an earlier run) is left exactly as it is, and its
    name added to `kept`. A packaged CRD that a Helm release other than `release` owns is not
    applied: it is added to `left` with what it lacks (waited for until Established only)."""
    crds: list[dict[str, Any]] = []
    names: list[str] = []
    for crd in load_packaged():
        name = crd["metadata"]["name"]
        names.append(name)
        decision = left_crd(get_crd(client, name), crd, release)
        if decision is not None:
            if left is not None:
                left.append(decision)
            continue
        client.apply(from_dict(crd), field_manager=FIELD_MANAGER, force=True)
        crds.append(crd)
    if node_feature:
        crd = node_feature_crd()
        if not create_if_absent(client, crd) and kept is not None:
            kept.append(crd["metadata"]["name"])
        crds.append(crd)
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            got = client.get(CustomResourceDefinition, name)
            conditions = (got.status.conditions if got.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"CRD {name} not Established after {timeout:.0f}s: check the apiserver log"
                )
            time.sleep(0.2)
    for crd in crds:
        _wait_served(client, crd, deadline, timeout)
    return names


def get_crd(client: Client, name: str) -> dict[str, Any] | None:
    """A CRD as the apiserver has it; None when there is none."""
    try:
        return dict(client.get(CustomResourceDefinition, name).to_dict())
    except HTTPStatusError as err:  # lightkube's ApiError is one
        if err.response.status_code == 404:
            return None
        raise


def create_if_absent(client: Client, crd: dict[str, Any]) -> bool:
    """Create a CRD nobody has created yet; True if this call created it."""
    try:
        client.create(from_dict(crd), field_manager=FIELD_MANAGER)
    except ApiError as err:
        if err.status.code != 409:
            raise
        return False
    return True


def _wait_served(client: Client, crd: dict[str, Any], deadline: float, timeout: float) -> None:
    """Until a list of the CRD's objects answers: Established comes before the apiserver serves the
    resource, which answers 429 "storage is (re)initializing" meanwhile (a new or recreated CRD)."""
    spec = crd["spec"]
    for version in (v["name"] for v in spec["versions"] if v.get("served")):
        names = (spec["group"], version, spec["names"]["kind"], spec["names"]["plural"])
        namespaced = spec.get("scope") == "Namespaced"
        resource = create_namespaced_resource(*names) if namespaced else create_global_resource(*names)
        where: dict[str, Any] = {"namespace": "*"} if namespaced else {}
        while True:
            try:
                next(iter(client.list(resource, chunk_size=1, **where)), None)
                break
            except ApiError as err:
                if err.status.code != 429:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"CRD {crd['metadata']['name']} {version} not served after {timeout:.0f}s "
                    "(the apiserver answers 429): check the apiserver log"
                )
            time.sleep(0.2)
