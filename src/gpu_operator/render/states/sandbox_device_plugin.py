"""State 17, state-sandbox-device-plugin: advertises passthrough GPUs and vGPUs to KubeVirt."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.states._common import sandbox
from gpu_operator.render.states._sandbox_plugin import sandbox_plugin_pod

NAME = "nvidia-sandbox-device-plugin"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    return sandbox_plugin_pod("nvidia-sandbox-device-plugin-ctr")


OPERAND = Operand(
    state="state-sandbox-device-plugin",
    gate=sandbox("sandboxDevicePlugin", mode="kubevirt"),
    account=NAME,
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]),),
    daemonset=DaemonSetDef(
        name="nvidia-sandbox-device-plugin-daemonset",
        deploy="sandbox-device-plugin",
        image=Image("sandboxDevicePlugin", "SANDBOX_DEVICE_PLUGIN_IMAGE"),
        pod=_pod,
    ),
)
