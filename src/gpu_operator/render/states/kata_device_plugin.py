"""State 18, state-kata-device-plugin: advertises GPUs to Kata Containers sandboxes."""

from __future__ import annotations

from gpu_operator.render.objects import env_field
from gpu_operator.render.operand import Image
from gpu_operator.render.states._sandbox_plugin import sandbox_plugin_operand

OPERAND = sandbox_plugin_operand(
    state="state-kata-device-plugin",
    account="nvidia-kata-sandbox-device-plugin",
    daemonset="nvidia-kata-sandbox-device-plugin-daemonset",
    deploy="kata-sandbox-device-plugin",
    image=Image("kataSandboxDevicePlugin", "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE"),
    mode="kata",
    main="nvidia-kata-sandbox-device-plugin-ctr",
    # the Kata plugin names its own ServiceAccount in the CDI specs it writes
    extra_env=(env_field("POD_SERVICE_ACCOUNT", "spec.serviceAccountName"),),
)
