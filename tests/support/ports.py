"""A local TCP port for a test's server: the simulator's own choice (sim/plane/processes.py's
free_port: a port nothing listens on, below the kernel's ephemeral range, so that no outgoing
connection takes it as its source port before the server binds it)."""

from __future__ import annotations

from gpu_operator.sim.plane.processes import free_port

__all__ = ["free_port"]
