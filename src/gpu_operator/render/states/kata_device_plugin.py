"""State 18, state-kata-device-plugin: advertises GPUs to Kata Containers sandboxes."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.objects import Ctx
from gpu_operator.render.operand import DaemonSetDef, Image, Operand, rule
from gpu_operator.render.states._common import sandbox
from gpu_operator.render.states._sandbox_plugin import sandbox_plugin_pod

NAME = "nvidia-kata-sandbox-device-plugin"


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    return sandbox_plugin_pod("nvidia-kata-sandbox-device-plugin-ctr")


OPERAND = Operand(
    state="state-kata-device-plugin",
    gate=sandbox("kataSandboxDevicePlugin", mode="kata"),
    account=NAME,
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch"]),),
    daemonset=DaemonSetDef(
        name="nvidia-kata-sandbox-device-plugin-daemonset",
        deploy="kata-sandbox-device-plugin",
        image=Image("kataSandboxDevicePlugin", "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE"),
        pod=_pod,
    ),
)
