"""The operator's *_IMAGE environment for the simulator: the chart's defaults (what the Helm chart
sets on the operator Deployment), with our own image for the validator and node-status exporter."""

from __future__ import annotations

from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES

DEFAULT_IMAGES = {
    **CHART_DEFAULT_IMAGES,
    "CUDA_BASE_IMAGE": "nvcr.io/nvidia/cuda:13.0.1-base-ubi9",
    # vGPU manager images are licensed and user-provided; the simulator uses a placeholder.
    "VGPU_MANAGER_IMAGE": "registry.example.com/nvidia/vgpu-manager:595.91.07",
}
