"""State 20, state-cc-manager: sets the GPUs' confidential-computing mode for Kata workloads."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import NODE_NAME, Ctx, container, env, mount
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, nvidia_selector, rule
from gpu_operator.render.states._common import SYS, VALIDATIONS, sandbox
from gpu_operator.vocabulary import VALIDATIONS_DIR

NAME = "nvidia-cc-manager"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    main = container(
        "nvidia-cc-manager",
        env_vars=[
            NODE_NAME,
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("DEFAULT_CC_MODE", ctx.spec.ccManager.defaultMode or "on"),
        ],
        mounts=[
            mount("host-sys", "/sys"),
            mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional"),
        ],
        privileged=True,
        lifecycle={
            "preStop": {"exec": {"command": ["sh", "-c", f"rm -f {VALIDATIONS_DIR}/.cc-manager-ctr-ready"]}}
        },
    )
    return {"hostPID": True, "containers": [main], "volumes": [SYS, VALIDATIONS]}


OPERAND = Operand(
    state="state-cc-manager",
    gate=sandbox("ccManager", mode="kata"),
    account=NAME,
    role_rules=(rule([""], ["pods"], ["get", "list", "watch"]),),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch"]),),
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="cc-manager",
        image=Image("ccManager", "CC_MANAGER_IMAGE"),
        pod=_pod,
        selector=nvidia_selector(NAME, key="name"),
    ),
)
