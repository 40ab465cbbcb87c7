"""config-manager wiring (device plugin, GFD, MPS): per-node configs from a user ConfigMap."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render.objects import (
    Ctx,
    add_mount,
    add_volume,
    configmap_volume,
    find,
    mount,
    remove_containers,
    upsert_env,
)
from gpu_operator.render.transforms.mig import mig_strategy_env
from gpu_operator.vocabulary import DEVICE_PLUGIN_CONFIG, PLUGIN_CONFIG_HASH

INIT = "config-manager-init"
SIDECAR = "config-manager"


def config_manager(pod: dict[str, Any], spec: ClusterPolicySpec, image: str) -> None:
    """Keep and wire the config-manager containers when devicePlugin.config.name is set, else drop them."""
    config = spec.devicePlugin.config
    if config is None or not config.name:
        remove_containers(pod, INIT, SIDECAR)
        return
    main = pod["containers"][0]
    upsert_env(main, "CONFIG_FILE", "/config/config.yaml")
    add_volume(pod, configmap_volume(config.name, config.name))
    add_volume(pod, {"name": "config", "emptyDir": {}})
    add_mount(main, mount("config", "/config"))
    for name in (INIT, SIDECAR):
        ctr = find(pod, name)
        if ctr is None:
            continue
        ctr["image"] = image
        ctr["imagePullPolicy"] = main.get("imagePullPolicy", "IfNotPresent")
        upsert_env(ctr, "DEFAULT_CONFIG", config.default or "")
        upsert_env(ctr, "FALLBACK_STRATEGIES", "empty")
        upsert_env(ctr, "CONFIG_FILE_SRCDIR", "/available-configs")
        upsert_env(ctr, "CONFIG_FILE_DST", "/config/config.yaml")
        upsert_env(ctr, "NODE_LABEL", DEVICE_PLUGIN_CONFIG)
        add_mount(ctr, mount(config.name, "/available-configs"))
        add_mount(ctr, mount("config", "/config"))
    if not pod.get("hostPID"):
        # the sidecar signals the main container to reload
        pod["shareProcessNamespace"] = True


def plugin_config(ds: dict[str, Any], ctx: Ctx) -> None:
    """What the device plugin, GFD and the MPS daemon share: MIG strategy env, config-manager, and
    the config's hash on the pod template: config-manager re-links the file only when the node's
    label changes, so an edit of the ConfigMap's content reaches the process when its pod starts
    again, which a new hash makes the DaemonSet do (NVIDIA/gpu-operator#1144)."""
    template = ds["spec"]["template"]
    pod = template["spec"]
    main = pod["containers"][0]
    mig_strategy_env(main, ctx.spec)
    config_manager(pod, ctx.spec, main["image"])
    config = ctx.spec.devicePlugin.config
    if config is not None and config.name and ctx.facts.plugin_config_hash:
        template.setdefault("metadata", {}).setdefault("annotations", {})[PLUGIN_CONFIG_HASH] = (
            ctx.facts.plugin_config_hash
        )
