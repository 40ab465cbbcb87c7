"""The user's kernel-module ConfigMap content, read only when VM guest nodes need it merged
(render/guestnvlink.py): on a cluster with such nodes, through the reconcile's reads (the same
ConfigMap's keys are read there too: `passinputs.ReadOnce` GETs it once)."""

from __future__ import annotations

from collections.abc import Iterable

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.passinputs import ObjectReader
from gpu_operator.render.facts import NodeFacts
from gpu_operator.render.guestnvlink import guest_nodes


async def kernel_module_data(
    kube: ObjectReader, policy: ClusterPolicy, namespace: str, nodes: Iterable[NodeFacts]
) -> dict[str, dict[str, str]]:
    """{name: data} of driver.kernelModuleConfig's ConfigMap when guest nodes get NVLink disabled
    (the policy's guestNVLink, the nodes' labels); empty otherwise or when it does not exist (the
    guests' ConfigMap then holds the parameter alone, as the driver reads none of the user's)."""
    driver = policy.spec.driver
    ref = driver.kernelModuleConfig.name if driver.kernelModuleConfig else None
    if not ref or not driver.guest_nvlink_disable() or not guest_nodes(nodes):
        return {}
    found = await kube.get_dict("v1", "ConfigMap", ref, namespace=namespace)
    if found is None:
        return {}
    return {ref: {str(k): str(v) for k, v in (found.get("data") or {}).items()}}
