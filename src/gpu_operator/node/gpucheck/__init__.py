"""`gpu-operator node gpu-check`: our node agents run read-only on a real GPU host, side by side with
what NVIDIA's own tools (nvidia-smi, NVML, the CUDA driver) say about it (docs/real-hosts.md)."""
