"""The test helpers that read refusals from fields (the audit log's responseStatus), so a timestamp
whose nanoseconds contain "403" is never taken for a refusal. Pod logs are read through the API
(`kubectl logs`, realnode_fixtures.api_log): messages without the kubelet's timestamps."""

from __future__ import annotations

from typing import Any, cast

from gpu_operator.sim.plane.controlplane import ControlPlane
from tests.support.audit import forbidden_in_namespace, refused, serviceaccount_user


class _Plane:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def audit_all(self) -> list[dict[str, Any]]:
        return self.events


def _event(user: str, code: int, verb: str = "get", stage: str = "ResponseComplete") -> dict[str, Any]:
    return {
        "user": {"username": user},
        "verb": verb,
        "stage": stage,
        "requestURI": "/api/v1/nodes/n",
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": "2026-11-24T11:45:16.403403Z",
    }


def test_refusals_are_read_from_the_status_code_and_user_fields() -> None:
    ours, other = serviceaccount_user("ns", "probe"), serviceaccount_user("ns-2", "probe")
    plane = cast(
        ControlPlane,
        _Plane(
            [
                _event(ours, 200),
                _event(ours, 403, "patch"),
                _event(ours, 403, stage="ResponseStarted"),
                _event(other, 403),
                _event(ours, 404),
            ]
        ),
    )
    assert forbidden_in_namespace(plane, "ns") == [f"{ours} patch /api/v1/nodes/n"]
    assert refused(plane, ours, 404) == [f"{ours} get /api/v1/nodes/n"]
    assert forbidden_in_namespace(plane, "ns-3") == []
