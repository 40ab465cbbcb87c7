"""The simulator plays the GPU probe on kwok nodes (sim/agents.py): each node gets what the probe
pod would publish for its shape's host tree, with the node agents' field manager."""

from __future__ import annotations

import json

from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpu_operator.sim import nodes
from gpu_operator.sim.agents import publish_probe_facts
from gpu_operator.sim.realspec import HOST_DRIVER_VERSION
from gpu_operator.vocabulary import (
    DRIVER_SOURCE,
    DRIVER_VERSION,
    NODE_AGENT_FIELD_MANAGER,
    PROBE_FACTS_ANNOTATION,
    PROBE_STATUS,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
)


def test_kwok_nodes_carry_the_probes_facts_of_their_shape(kube: Client) -> None:
    by_spec = {spec: nodes.add_nodes(kube, [spec], start=7700 + i * 10)
               for i, spec in enumerate(("vfio-passthrough:2", "host-driver:1"))}
    names = [n for created in by_spec.values() for n in created]
    try:
        nodes.wait_ready(kube, names)
        agent = Client(config=kube.config, field_manager=NODE_AGENT_FIELD_MANAGER)
        codes = publish_probe_facts(agent, by_spec, "gpu-operator")
        assert set(codes) == set(names)
        for name in by_spec["vfio-passthrough:2"]:
            meta = kube.get(Node, name).metadata
            assert meta is not None and meta.annotations is not None and meta.labels is not None
            facts = json.loads(meta.annotations[PROBE_FACTS_ANNOTATION])
            assert facts["driverSource"] == "vfio", facts
            assert facts["gpus"] and {g["driver"] for g in facts["gpus"]} == {"vfio-pci"}, facts
            assert all(g["vendorDevice"].startswith("10de:") for g in facts["gpus"]), facts
            assert meta.labels[PROBE_STATUS] in ("ok", "warning", "error")
            # written as the probe writes: the node agents' field manager owns the annotation
            managers = {m.manager for m in meta.managedFields or []
                        if PROBE_FACTS_ANNOTATION.replace("/", "~1") in json.dumps(m.fieldsV1)
                        or f"f:{PROBE_FACTS_ANNOTATION}" in json.dumps(m.fieldsV1)}
            assert managers == {NODE_AGENT_FIELD_MANAGER}, managers
            # and the vfio manager's pass over the same tree: every GPU already on vfio-pci
            assert meta.labels[VFIO_STATE] == "bound", meta.labels
            record = json.loads(meta.annotations[VFIO_RESULT_ANNOTATION])
            assert {g["driver"] for g in record["gpus"].values()} == {"vfio-pci"}, record
        (host,) = by_spec["host-driver:1"]
        labels = kube.get(Node, host).metadata.labels or {}
        assert labels[DRIVER_SOURCE] == "host" and labels[DRIVER_VERSION] == HOST_DRIVER_VERSION, labels
        assert VFIO_STATE not in labels  # a container node: no vfio manager
    finally:
        nodes.remove_nodes(kube, names)
