"""The user's kernel-module ConfigMap is read only where VM guest nodes need it merged."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.kmodconfig import kernel_module_data
from gpu_operator.render.facts import NodeFacts
from tests.unit.render.renderkit import nodes


class StubKube:
    """Answers get_dict from a dict of ConfigMaps and records each read."""

    def __init__(self, configmaps: dict[str, dict[str, Any]]) -> None:
        self.configmaps = configmaps
        self.reads: list[tuple[str, str, str | None]] = []

    async def get_dict(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any:
        self.reads.append((kind, name, namespace))
        return self.configmaps.get(name)


def read(
    spec: dict[str, Any], *shapes: str, configmaps: dict[str, dict[str, Any]] | None = None
) -> tuple[Any, Any]:
    kube = StubKube(configmaps if configmaps is not None else {"kmods": {"data": {"nvidia.conf": "a=1\n"}}})
    policy = ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": spec})
    facts = [NodeFacts.of(n) for n in nodes(*shapes)]
    got = asyncio.run(kernel_module_data(kube, policy, "gpu-operator", facts))
    return got, kube.reads


KMODS = {"driver": {"kernelModuleConfig": {"name": "kmods"}}}


def test_read_for_guest_nodes() -> None:
    got, reads = read(KMODS, "dgx-h100:1", "kubevirt-guest-h100:1")
    assert got == {"kmods": {"nvidia.conf": "a=1\n"}}
    assert reads == [("ConfigMap", "kmods", "gpu-operator")]


def test_not_read_without_guests_or_when_left() -> None:
    assert read(KMODS, "dgx-h100:2") == ({}, [])
    left = {"driver": {"kernelModuleConfig": {"name": "kmods"}, "guestNVLink": "leave"}}
    assert read(left, "kubevirt-guest-h100:1") == ({}, [])
    assert read({}, "kubevirt-guest-h100:1") == ({}, [])


def test_a_missing_configmap_reads_as_none() -> None:
    got, reads = read(KMODS, "kubevirt-guest-h100:1", configmaps={})
    assert got == {} and len(reads) == 1


def test_the_operators_node_cache_keeps_what_the_rule_reads() -> None:
    from gpu_operator.controllers.views import NodeView
    from gpu_operator.render.guestnvlink import needs_nvlink_off

    [node] = nodes("kubevirt-guest-h100:1")
    meta = node["metadata"]
    view = NodeView.of_parts(meta["name"], meta["labels"], {})
    assert needs_nvlink_off(view.facts)


def test_one_reconcile_reads_the_kernel_module_configmap_once_for_its_keys_and_its_content() -> None:
    from gpu_operator.controllers.passinputs import ReadOnce, configmap_keys

    kube = StubKube({"kmods": {"data": {"nvidia.conf": "a=1\n"}}})
    policy = ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": KMODS})
    facts = [NodeFacts.of(n) for n in nodes("kubevirt-guest-h100:1")]
    reads = ReadOnce(kube)

    async def both() -> tuple[Any, Any]:
        return (
            await configmap_keys(reads, policy, "gpu-operator"),
            await kernel_module_data(reads, policy, "gpu-operator", facts),
        )

    keys, data = asyncio.run(both())
    assert keys == {"kmods": ("nvidia.conf",)} and data == {"kmods": {"nvidia.conf": "a=1\n"}}
    assert kube.reads == [("ConfigMap", "kmods", "gpu-operator")]
