"""What our node agents would publish on the kwok nodes, which run no pod: kwok plays the kubelet,
and this plays the GPU probe. For each shape the simulator builds the host tree a node of that
shape has (`realspec.host_spec`, the real node's builder) and runs the probe's own publish step
(`node.publish.publish_once`: probe, findings, labels, the probe-facts annotation, Events) against
each kwok node of that shape, with the node agents' field manager, as the probe DaemonSet's pod
would. So the KubeVirt device list, `gpu-operator status` and doctor see facts on a simulator of
kwok nodes only.

On nodes whose shape makes them vm-passthrough nodes it also plays the vfio manager: its own
reconcile pass (`node.vfio_node.reconcile`: select the node's passthrough GPUs from its labels and
annotations, bind, record) over the same tree, as the vfio-manager pod's field manager, so the
node gets the outcome label `nvidia.com/gpu.vfio.state` and the result annotation. The trees'
GPUs already sit on vfio-pci, so the pass finds nothing to move; a write it would still make is
recorded, not applied (there is no kernel behind these trees).

Not played: later changes (the agents re-run on a host that changes; these trees do not change).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_operator import shapes
from gpu_operator.node.hostfs import RecordingWriter
from gpu_operator.node.kubeapi import KubeNodeView
from gpu_operator.node.publish import publish_once
from gpu_operator.node.vfio_node import reconcile
from gpu_operator.sim import hosttree
from gpu_operator.sim.realspec import host_spec
from gpu_operator.vocabulary import VM_PASSTHROUGH, WORKLOAD_CONFIG


def publish_probe_facts(client: Any, nodes_by_spec: Mapping[str, list[str]], namespace: str,
                        progress: Callable[[str], None] = lambda _m: None) -> dict[str, set[str]]:
    """Publish the probe's view of each node's host tree; `client` must write as the node agents'
    field manager. Returns each node's finding codes."""
    found: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-operator-sim-hosts-") as base:
        for i, (spec, names) in enumerate(nodes_by_spec.items()):
            if not names:
                continue
            fs = hosttree.build(host_spec(spec), Path(base) / str(i))
            shape = shapes.parse_spec(spec)[0]
            passthrough = shape.labels(names[0]).get(WORKLOAD_CONFIG) == VM_PASSTHROUGH
            for name in names:
                codes, _ = publish_once(fs, KubeNodeView(name, namespace, client=client,
                                                         component="gpu-operator-node-probe"))
                found[name] = codes
                if passthrough:
                    reconcile(fs, RecordingWriter(), KubeNodeView(name, namespace, client=client,
                                                                  component="gpu-operator-vfio-manager"))
            progress(f"probe facts published for {len(names)} {spec.split(':')[0]} node(s) (from its host tree)")
    return found
