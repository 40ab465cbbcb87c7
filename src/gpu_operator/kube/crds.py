"""Applies the packaged CRDs (server-side apply) and waits until the apiserver serves them."""

from __future__ import annotations

import time

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.kube.client import FIELD_MANAGER


def apply_crds(client: Client, timeout: float = 60.0) -> list[str]:
    """Apply every CRD shipped with the package; returns their names once all are Established."""
    names = []
    for crd in load_packaged():
        client.apply(from_dict(crd), field_manager=FIELD_MANAGER, force=True)
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            got = client.get(CustomResourceDefinition, name)
            conditions = (got.status.conditions if got.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s: check the apiserver log")
            time.sleep(0.2)
    return names
