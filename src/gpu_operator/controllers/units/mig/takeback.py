"""What `gpu-operator cleanup` takes back of MIG changes (controllers/cleanup.py, `TakeBack`): the
NvidiaMIGReady condition on every node (unit.py's `take_back`); our MIG annotations go with the
labels step."""

from __future__ import annotations

from gpu_operator.controllers.cleanup import Uninstall, each_node
from gpu_operator.controllers.units.mig import unit


async def take_back(uninstall: Uninstall) -> list[str]:
    return await each_node(uninstall.nodes, lambda node: unit.take_back(uninstall.kube, node))
