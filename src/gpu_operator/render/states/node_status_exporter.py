"""State 12, state-node-status-exporter: per-node validation metrics (validator `metrics` mode)."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import (
    NODE_NAME,
    OPERATOR_NAMESPACE,
    Ctx,
    container,
    env,
    mount,
)
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import HOST_ROOT, VALIDATIONS, service, service_monitor, when_enabled
from gpu_operator.vocabulary import VALIDATIONS_DIR

NAME = "nvidia-node-status-exporter"
PORT = 8000
PORT_NAME = "node-status"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        NAME,
        command=["nvidia-validator"],
        env_vars=[
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("COMPONENT", "metrics"),
            env("METRICS_PORT", str(PORT)),
            NODE_NAME,
            OPERATOR_NAMESPACE,
        ],
        ports=[{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        # status files, and the host's / for the driver check (nvidia-smi under /host)
        mounts=[
            mount("run-nvidia-validations", VALIDATIONS_DIR, readonly=True, propagation="HostToContainer"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
        ],
        securityContext={"privileged": True, "runAsUser": 0},
    )
    return {"containers": [main], "volumes": [VALIDATIONS, HOST_ROOT]}


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    return [
        service(NAME, state, ctx.ns, PORT, PORT_NAME, NAME, scrape=True),
        *service_monitor(NAME, state, ctx, PORT_NAME, NAME),
    ]


OPERAND = Operand(
    state="state-node-status-exporter",
    gate=when_enabled("nodeStatusExporter"),
    account=NAME,
    role_rules=(rule([""], ["pods"], ["get", "list", "watch"]),),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]),),
    extras=_extras,
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="node-status-exporter",
        image=Image("nodeStatusExporter", "VALIDATOR_IMAGE"),
        pod=_pod,
    ),
)
