"""What `gpu-operator cleanup` takes back of GPU health (controllers/cleanup.py, `TakeBack`): on
every node its condition, its quarantine taint and the cordon remediation set (executor.py's
`take_back`: remediation's record says whose cordon it is, so this runs before the labels step takes
our annotations); on the DRA stack its DeviceTaintRules (dra.py's `delete_rules`); and, where the
command stopped the operator, the remediation requests Secret the operator made in its namespace
(Helm did not make it, so Helm does not delete it)."""

from __future__ import annotations

from gpu_operator.controllers.cleanup import Uninstall, each_node
from gpu_operator.controllers.units.health import dra, executor
from gpu_operator.kube.client import ObjectKey
from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET


async def take_back(uninstall: Uninstall) -> list[str]:
    kube = uninstall.kube
    done = []
    if uninstall.namespace is not None and await kube.delete(
        ObjectKey("v1", "Secret", HEALTH_REQUESTS_SECRET, uninstall.namespace)
    ):
        done.append(f"deleted Secret {uninstall.namespace}/{HEALTH_REQUESTS_SECRET}")
    done += await each_node(uninstall.nodes, lambda node: executor.take_back(kube, node))
    done += [f"deleted DeviceTaintRule {name}" for name in await dra.delete_rules(kube)]
    return done
