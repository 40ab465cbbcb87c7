"""The images the upstream Helm chart deploys by default, keyed by the operator's *_IMAGE env vars.

The operator itself takes these from its Deployment's env; offline tools (`gpu-operator render`)
fall back to them so a minimal policy renders without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpu_operator import __version__

# Our own image (the operator, `nvidia-validator`, the node-status exporter, the CRD hook); the
# chart names the same one (deployments/gpu-operator/values.yaml: operator/validator).
OWN_IMAGE = f"ghcr.io/gpu-operator-py/gpu-operator:{__version__}"
# The CUDA and plugin workload pods run `vectorAdd`; our image has no CUDA sample, NVIDIA's
# operator image ships it at /usr/bin/vectorAdd. Operator env CUDA_VALIDATOR_IMAGE overrides it.
CUDA_WORKLOAD_IMAGE = "nvcr.io/nvidia/gpu-operator:v26.7.0"

CHART_DEFAULT_IMAGES: dict[str, str] = {
    "DRIVER_IMAGE": "nvcr.io/nvidia/driver:595.91.07",
    "DRIVER_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
    "CONTAINER_TOOLKIT_IMAGE": "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0",
    "DEVICE_PLUGIN_IMAGE": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
    "GFD_IMAGE": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
    "DCGM_IMAGE": "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04",
    "DCGM_EXPORTER_IMAGE": "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
    "VALIDATOR_IMAGE": OWN_IMAGE,
    "CUDA_VALIDATOR_IMAGE": CUDA_WORKLOAD_IMAGE,
    "MIG_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0",
    "GDS_IMAGE": "nvcr.io/nvidia/cloud-native/nvidia-fs:2.29.4",
    "GDRCOPY_IMAGE": "nvcr.io/nvidia/cloud-native/gdrdrv:v2.6",
    "VFIO_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
    "VGPU_DEVICE_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/vgpu-device-manager:v0.5.0",
    "SANDBOX_DEVICE_PLUGIN_IMAGE": "nvcr.io/nvidia/kubevirt-gpu-device-plugin:v1.6.0",
    "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE": "nvcr.io/nvidia/cloud-native/nvidia-sandbox-device-plugin:v0.0.5",
    # the chart's draDriver values (NVIDIA's chart writes them into its GPUCluster; ours also gives
    # them to the operator, so `spec: {draDriver: {}}` works)
    "DRA_DRIVER_IMAGE": "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0",
    "CC_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-cc-manager:v0.4.3",
    # The vGPU manager image is licensed: users build and host it themselves, so no default.
}


def missing_images(environ: Mapping[str, str]) -> dict[str, str]:
    """The chart's default of every image variable `environ` does not set: what `gpu-operator run`
    falls back to when it was started without the chart's Deployment env. One set to "" stays
    unset on purpose (no fallback: a policy must name that image)."""
    return {name: image for name, image in CHART_DEFAULT_IMAGES.items() if name not in environ}
