"""The operator's *_IMAGE environment for the simulator, with the upstream chart's default images
(what the Helm chart sets on the operator Deployment)."""

from __future__ import annotations

NVCR = "nvcr.io/nvidia"

DEFAULT_IMAGES = {
    "DRIVER_IMAGE": f"{NVCR}/driver:595.91.07",
    "DRIVER_MANAGER_IMAGE": f"{NVCR}/cloud-native/k8s-driver-manager:v0.12.0",
    "CONTAINER_TOOLKIT_IMAGE": f"{NVCR}/k8s/container-toolkit:v1.20.0",
    "DEVICE_PLUGIN_IMAGE": f"{NVCR}/k8s-device-plugin:v0.20.0",
    "GFD_IMAGE": f"{NVCR}/k8s-device-plugin:v0.20.0",
    "DCGM_IMAGE": f"{NVCR}/cloud-native/dcgm:4.6.0-1-ubuntu24.04",
    "DCGM_EXPORTER_IMAGE": f"{NVCR}/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
    "MIG_MANAGER_IMAGE": f"{NVCR}/cloud-native/k8s-mig-manager:v0.15.0",
    "VALIDATOR_IMAGE": f"{NVCR}/gpu-operator:v26.7.0",
    "CUDA_BASE_IMAGE": f"{NVCR}/cuda:13.0.1-base-ubi9",
    "GDS_IMAGE": f"{NVCR}/cloud-native/nvidia-fs:2.29.4",
    "GDRCOPY_IMAGE": f"{NVCR}/cloud-native/gdrdrv:v2.6",
    "VFIO_MANAGER_IMAGE": f"{NVCR}/cloud-native/k8s-driver-manager:v0.12.0",
    "SANDBOX_DEVICE_PLUGIN_IMAGE": f"{NVCR}/kubevirt-gpu-device-plugin:v1.6.0",
    "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE": f"{NVCR}/cloud-native/nvidia-sandbox-device-plugin:v0.0.5",
    "VGPU_DEVICE_MANAGER_IMAGE": f"{NVCR}/cloud-native/vgpu-device-manager:v0.5.0",
    "CC_MANAGER_IMAGE": f"{NVCR}/cloud-native/k8s-cc-manager:v0.4.3",
    # vGPU manager images are licensed and user-provided; the simulator uses a placeholder.
    "VGPU_MANAGER_IMAGE": "registry.example.com/nvidia/vgpu-manager:595.91.07",
}
