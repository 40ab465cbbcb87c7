"""The k8s-driver-manager init container of the driver, vGPU manager and VFIO manager pods."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.api.common import DriverManagerSpec
from gpu_operator.render.objects import find, upsert_env
from gpu_operator.render.transforms.component import apply_image, env_upsert
from gpu_operator.render.transforms.image import image_path

INIT = "k8s-driver-manager"


def driver_manager(
    pod: dict[str, Any],
    fields: DriverManagerSpec | None,
    operator_env: dict[str, str],
    field_path: str,
    spec: ClusterPolicySpec,
) -> None:
    """Image, pull settings, RDMA flags and the user's env (eviction/drain knobs) of the k8s-driver-manager init."""
    ctr = find(pod, INIT)
    if ctr is None:
        return
    apply_image(ctr, pod, image_path(fields, "DRIVER_MANAGER_IMAGE", operator_env, field_path), fields)
    if spec.driver.rdma_on():
        upsert_env(ctr, "GPU_DIRECT_RDMA_ENABLED", "true")
        if spec.driver.host_mofed():
            upsert_env(ctr, "USE_HOST_MOFED", "true")
    env_upsert(ctr, fields.env if fields else None)
