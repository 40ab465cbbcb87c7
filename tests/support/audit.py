"""What the apiserver refused, read from fields: the audit log's `responseStatus.code` and the
requesting user, never a status code searched for in free text (a log timestamp's nanoseconds
contain "403" often enough to fail a run at random)."""

from __future__ import annotations

from typing import Any

from gpu_operator.sim.plane.controlplane import ControlPlane

FORBIDDEN = 403


def serviceaccount_user(namespace: str, name: str = "") -> str:
    """The audit log's username of ServiceAccount namespace/name (with no name: the prefix of all
    of that namespace's ServiceAccounts)."""
    return f"system:serviceaccount:{namespace}:{name}"


def refused(plane: ControlPlane, user_prefix: str, code: int = FORBIDDEN) -> list[str]:
    """Every request (read or write) by a user whose name starts with `user_prefix` that the
    apiserver answered with `code`, one line each: user, verb, request URI."""
    return [
        f"{e['user']['username']} {e.get('verb')} {e.get('requestURI')}"
        for e in plane.audit_all()
        if e.get("stage") == "ResponseComplete"
        and str(e.get("user", {}).get("username", "")).startswith(user_prefix)
        and status_code(e) == code
    ]


def forbidden_in_namespace(plane: ControlPlane, namespace: str) -> list[str]:
    """The 403s the ServiceAccounts of `namespace` (our pods) were answered."""
    return refused(plane, serviceaccount_user(namespace))


def status_code(event: dict[str, Any]) -> int | None:
    code = (event.get("responseStatus") or {}).get("code")
    return int(code) if code is not None else None
