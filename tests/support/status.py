"""Reading ClusterPolicy and NVIDIADriver status in integration tests, and waiting for Reconciled.

Only a missing object (404) reads as an empty status; any other refusal (a 403, say) raises, so an
RBAC or API regression fails the test instead of looking like "not ready yet".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from tests.support.waiting import wait_for


def _status(kube: Client, resource: Any, name: str) -> dict[str, Any]:
    try:
        obj = kube.get(resource, name)
    except ApiError as err:
        if err.status.code == 404:
            return {}
        raise
    return dict(obj.get("status") or {})


def policy_status(kube: Client, name: str = "cluster-policy") -> dict[str, Any]:
    """The ClusterPolicy's status; {} while it does not exist."""
    return _status(kube, ClusterPolicyResource, name)


def driver_status(kube: Client, name: str) -> dict[str, Any]:
    """The NVIDIADriver's status; {} while it does not exist."""
    return _status(kube, NVIDIADriverResource, name)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition of that type, or {}."""
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def is_reconciled(status: dict[str, Any]) -> bool:
    """state ready and the Ready condition's reason Reconciled."""
    return status.get("state") == "ready" and condition(status, "Ready").get("reason") == "Reconciled"


def reconciled(
    kube: Client,
    name: str = "cluster-policy",
    *,
    timeout: float = 120.0,
    context: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """Waits until the ClusterPolicy is ready with reason Reconciled; returns its status."""
    return wait_for(
        f"ClusterPolicy {name} ready (Reconciled)",
        lambda: policy_status(kube, name),
        until=is_reconciled,
        timeout=timeout,
        context=context,
    )
