"""gpu_operator.render.transforms."""
