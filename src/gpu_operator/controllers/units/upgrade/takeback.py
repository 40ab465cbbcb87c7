"""What `gpu-operator cleanup` takes back of driver upgrades (controllers/cleanup.py, `TakeBack`):
the cordon of a node an upgrade in progress had cordoned. It runs before the labels step, since the
upgrade-state label and the initial-state annotation say whose cordon it is; a node a user cordoned
stays cordoned."""

from __future__ import annotations

from typing import Any

from gpu_operator.controllers.cleanup import Uninstall, each_node
from gpu_operator.controllers.units.upgrade.state import (
    CORDON_REQUIRED,
    UNKNOWN,
    UPGRADE_DONE,
    UPGRADE_REQUIRED,
)
from gpu_operator.vocabulary import UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION, UPGRADE_STATE

# Upgrade states in which the node is not (yet, or no longer) cordoned by the upgrade controller.
_NOT_CORDONED_BY_US = frozenset({UNKNOWN, UPGRADE_REQUIRED, CORDON_REQUIRED, UPGRADE_DONE})


def cordoned_by_us(node: dict[str, Any]) -> bool:
    """The driver upgrade controller cordoned this node and has not uncordoned it yet: it is
    unschedulable in a state past cordon-required, and was not unschedulable before the upgrade
    began (the initial-state annotation is not "true"). A node a user cordoned stays cordoned."""
    meta = node.get("metadata") or {}
    state = (meta.get("labels") or {}).get(UPGRADE_STATE, UNKNOWN)
    initially = (meta.get("annotations") or {}).get(UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION)
    return (
        bool((node.get("spec") or {}).get("unschedulable"))
        and state not in _NOT_CORDONED_BY_US
        and initially != "true"
    )


async def take_back(uninstall: Uninstall) -> list[str]:
    """Uncordon the nodes a driver upgrade left cordoned (an uninstall in the middle of one)."""

    async def uncordon(node: dict[str, Any]) -> list[str]:
        if not cordoned_by_us(node):
            return []
        await uninstall.kube.merge_patch(
            "v1", "Node", node["metadata"]["name"], {"spec": {"unschedulable": False}}
        )
        return ["uncordoned (a driver upgrade had cordoned it)"]

    return await each_node(uninstall.nodes, uncordon)
