"""gpu_operator.render.states."""
