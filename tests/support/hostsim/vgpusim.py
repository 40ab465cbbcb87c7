"""The vGPU host's hardware and driver for the node agents' tests: the simulator's model
(`gpu_operator.sim.hardware.vgpuhw`), played here over the h100-vgpu fixture, in memory."""

from __future__ import annotations

from gpu_operator.sim.hardware.vgpuhw import HEADER, SimGpu, SimType, VgpuHostSim

__all__ = ["HEADER", "SimGpu", "SimType", "VgpuHostSim"]
