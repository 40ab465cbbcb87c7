"""gpu_operator.sim."""
