"""State 17, state-sandbox-device-plugin: advertises passthrough GPUs and vGPUs to KubeVirt."""

from __future__ import annotations

from gpu_operator.render.operand import Image
from gpu_operator.render.states._sandbox_plugin import sandbox_plugin_operand

OPERAND = sandbox_plugin_operand(
    state="state-sandbox-device-plugin",
    account="nvidia-sandbox-device-plugin",
    daemonset="nvidia-sandbox-device-plugin-daemonset",
    deploy="sandbox-device-plugin",
    image=Image("sandboxDevicePlugin", "SANDBOX_DEVICE_PLUGIN_IMAGE"),
    mode="kubevirt",
    main="nvidia-sandbox-device-plugin-ctr",
)
