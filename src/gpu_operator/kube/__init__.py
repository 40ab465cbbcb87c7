"""gpu_operator.kube."""
