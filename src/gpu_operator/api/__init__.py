"""gpu_operator.api."""
