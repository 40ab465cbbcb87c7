"""gpu-operator: a Python implementation of the NVIDIA GPU Operator for Kubernetes."""

__version__ = "0.1.0"
