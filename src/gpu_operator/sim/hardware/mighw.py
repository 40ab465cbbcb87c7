"""The MIG state of a node's GPUs (what NVML reports: MIG mode, GPU and compute instances).

The state lives on the GPUs, in no file of the host: the simulator keeps it beside the node's host
tree (`<hosts>/<node>/mig.json`, like the fault book), or in memory where the kwok nodes have no
host trees; every GPU starts with MIG off (a fresh boot of our shapes). The MIG manager's stand-in
changes it; GFD's and the device plugin's stand-ins read it, as the real ones read NVML.

The driver's files that go with it in a host tree: `migtree`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from gpu_operator.shapes import Shape
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.hardware.migparted import GpuMig, from_json
from gpu_operator.sim.hardware.migtree import STATE_FILE, save_tree_state


def shape_gpus(shape: Shape) -> list[GpuMig]:
    """A host of `shape` as it boots: its GPUs (the UUIDs its host tree gives them), MIG off."""
    return list(_shape_gpus(shape.name)) if shape.nvidia_gpus else []


@functools.cache
def _shape_gpus(name: str) -> tuple[GpuMig, ...]:
    from gpu_operator.sim.realnode.realspec import host_spec

    spec = host_spec(name)
    gpus = sorted(
        (str(d["address"]), str(d["device"]).lower())
        for d in spec["devices"]
        if str(d.get("vendor", "")).lower() == "10de" and str(d.get("class", "")).startswith("03")
    )
    return tuple(GpuMig(i, device, hosttree.gpu_uuid(a)) for i, (a, device) in enumerate(gpus))


class MigHardware:
    """The kwok nodes' GPUs' MIG state: beside their host trees under `hosts`, or in memory."""

    def __init__(self, hosts: Path | None = None) -> None:
        self.hosts = hosts
        self.memory: dict[str, list[GpuMig]] = {}

    def _file(self, node: str) -> Path | None:
        return None if self.hosts is None else self.hosts / node / STATE_FILE

    def gpus(self, node: str, shape: Shape) -> list[GpuMig]:
        path = self._file(node)
        if path is not None and path.is_file():
            return from_json(json.loads(path.read_text()))
        return self.memory.get(node) or shape_gpus(shape)

    def set(self, node: str, shape: Shape, gpus: list[GpuMig]) -> None:
        """The GPUs as the MIG manager left them; with host trees, the driver's files there too."""
        path = self._file(node)
        if path is None or self.hosts is None:
            self.memory[node] = gpus
            return
        from gpu_operator.sim.hardware.faults import NodeHosts, node_host_spec

        hosts = NodeHosts(self.hosts)
        save_tree_state(hosts.faults(node, node_host_spec(shape.name)).root, gpus)
        hosts.announce(node)
