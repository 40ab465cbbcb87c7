"""gpu_operator.node."""
