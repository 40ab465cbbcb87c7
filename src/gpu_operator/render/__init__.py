"""gpu_operator.render."""
