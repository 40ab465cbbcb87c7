"""State 8, state-dcgm: a standalone DCGM host engine (dcgm-exporter connects to it on port 5555)."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx, container
from gpu_operator.render.operand import DaemonSetDef, Image, Operand
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import VALIDATIONS, service, wait_for, when_enabled

NAME = "nvidia-dcgm"
PORT = 5555


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    port: dict[str, Any] = {"name": "dcgm", "containerPort": PORT, "protocol": "TCP"}
    if ctx.spec.dcgm.hostPort:
        port["hostPort"] = ctx.spec.dcgm.hostPort
    probe = {"tcpSocket": {"port": PORT}, "initialDelaySeconds": 15}
    # the image's entrypoint starts nv-hostengine listening on all interfaces
    main = container(
        "nvidia-dcgm-ctr", ports=[port], privileged=True, livenessProbe=probe, readinessProbe=dict(probe)
    )
    return {
        "initContainers": [wait_for("toolkit", "toolkit-ready")],
        "containers": [main],
        "volumes": [VALIDATIONS],
    }


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    return [service(NAME, state, ctx.ns, PORT, "dcgm", NAME, internalTrafficPolicy="Local")]


OPERAND = Operand(
    state="state-dcgm",
    gate=when_enabled("dcgm"),
    account=NAME,
    extras=_extras,
    daemonset=DaemonSetDef(
        name=NAME, deploy="dcgm", image=Image("dcgm", "DCGM_IMAGE"), pod=_pod, gpu_access=True
    ),
)
