"""gpu_operator.controllers."""
