"""NodeView keeps what the GPU health signals read: the report and remediation annotations, our
taints, the NvidiaGPUReady condition; nothing else of those changes the view."""

from __future__ import annotations

from typing import Any

import msgspec

from gpu_operator.controllers.reflector import SlimNode, view_of
from gpu_operator.controllers.views import NodeView
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_REPORT_ANNOTATION, HEALTH_STATE, HEALTH_TAINT

STARTUP = "startup-taint.cluster-autoscaler.kubernetes.io/nvidia-gpu-not-validated"


def body(
    taints: list[dict[str, str]], conditions: list[dict[str, str]], notes: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n1",
            "labels": {HEALTH_STATE: "draining", "kubernetes.io/os": "linux"},
            "annotations": {
                HEALTH_REPORT_ANNOTATION: '{"validated": true}',
                "nvidia.com/gpu-health.attempts": "1",
                **(notes or {}),
            },
        },
        "spec": {"taints": taints},
        "status": {"conditions": conditions},
    }


OURS = [{"key": HEALTH_TAINT, "effect": "NoSchedule"}, {"key": STARTUP, "effect": "NoSchedule"}]
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
COND = {"type": HEALTH_CONDITION, "status": "False", "reason": "GPUUnhealthy", "message": "GPU x"}
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
}


def test_view_keeps_our_taints_condition_and_annotations() -> None:
    view = NodeView.of(body([OTHER, *OURS], [READY, COND]))
    assert view.taints == ((HEALTH_TAINT, "NoSchedule", ""), (STARTUP, "NoSchedule", ""))
    assert view.gpu_condition == ("False", "GPUUnhealthy", "GPU x")
    assert view.annotations[HEALTH_REPORT_ANNOTATION] == '{"validated": true}'
    assert view.annotations["nvidia.com/gpu-health.attempts"] == "1"
    assert view.labels[HEALTH_STATE] == "draining"


def test_only_what_we_read_changes_the_view() -> None:
    base = NodeView.of(body([OTHER, *OURS], [READY, COND]))
    assert NodeView.of(body([*OURS], [READY, COND], {"other.example/x": "y"})) == base
    assert NodeView.of(body([OURS[0]], [READY, COND])) != base
    assert NodeView.of(body([OTHER, *OURS], [READY, {**COND, "message": "GPU y"}])) != base


def test_the_watch_decoder_builds_the_same_view() -> None:
    raw = body([OTHER, *OURS], [READY, COND])
    decoded = msgspec.json.decode(msgspec.json.encode(raw), type=SlimNode)
    assert view_of(decoded) == NodeView.of(raw)
