"""CDI and NRI wiring of GPU-using operands, and the runtimeClassName they run with."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.render.objects import upsert_env
from gpu_operator.render.transforms.runtime import runtime_class_name

NRI_ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/container."
NRI_ALL_GPUS = "management.nvidia.com/gpu=all"


def gpu_access(ds: dict[str, Any], spec: ClusterPolicySpec, runtime: str) -> None:
    """Give the pod GPU access: the nvidia RuntimeClass, or NRI annotations when NRI injects devices."""
    template = ds["spec"]["template"]
    name = runtime_class_name(spec, runtime)
    if name:
        template["spec"]["runtimeClassName"] = name
    if spec.cdi.nri():
        annotations = template["metadata"].setdefault("annotations", {})
        for ctr in template["spec"]["containers"]:
            annotations[NRI_ANNOTATION_PREFIX + ctr["name"]] = NRI_ALL_GPUS


def device_plugin_cdi(ctr: dict[str, Any], spec: ClusterPolicySpec) -> None:
    """Device-plugin style operands hand out GPUs as CDI devices when CDI is on."""
    if not spec.cdi.on():
        return
    upsert_env(ctr, "CDI_ENABLED", "true")
    upsert_env(ctr, "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri")
    upsert_env(ctr, "CDI_ANNOTATION_PREFIX", "cdi.k8s.io/")
    if spec.toolkit.on():
        upsert_env(
            ctr, "NVIDIA_CDI_HOOK_PATH", spec.toolkit.installDir.rstrip("/") + "/toolkit/nvidia-cdi-hook"
        )


def rdma_storage_env(ctr: dict[str, Any], spec: ClusterPolicySpec) -> None:
    """GDS needs MOFED; GDRCopy is announced on its own."""
    if spec.gds.on():
        upsert_env(ctr, "GDS_ENABLED", "true")
        upsert_env(ctr, "MOFED_ENABLED", "true")
    if spec.gdrcopy.on():
        upsert_env(ctr, "GDRCOPY_ENABLED", "true")
