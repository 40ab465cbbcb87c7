"""The GPU systems sold now, on the real control plane with the operator (real process): a DGX A100
takes an A100 MIG layout, a GB200 NVL72 tray refuses a B200 one; GB200 trays are arm64 nodes whose
operands run there, whose GFD publishes their NVLink clique (the same on the trays of one domain)
and whose Node gets it through the operator's mirroring; an RTX PRO 6000 server takes a +gfx layout
and advertises it as a resource of its own (sim/standins/gfd.py, sim/standins/migmanager.py, sim/standins/migresources.py;
the facts in docs/simulator.md "GPU systems and their sources")."""

from __future__ import annotations

import functools
from collections.abc import Callable

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator import shapes
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.waiting import wait_for

MIG_CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
GPU = "nvidia.com/gpu"
GFX = "nvidia.com/mig-1g.24gb.gfx"


def node_of(kube: Client, name: str, resources: str = "capacity") -> tuple[dict[str, str], dict[str, str]]:
    """The node's labels and its status `resources` (capacity or allocatable)."""
    node = kube.get(Node, name)
    held = (getattr(node.status, resources) if node.status else None) or {}
    return dict((node.metadata.labels if node.metadata else None) or {}), {k: str(v) for k, v in held.items()}


def test_new_systems_run_their_mig_layouts_cliques_and_arch(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
) -> None:
    a100 = fake_nodes("dgx-a100:1")[0]
    trays = fake_nodes("gb200-nvl72:2")
    operator = start_operator()
    cluster_policies({"mig": {"strategy": "single"}, "migManager": {"config": {"default": "all-disabled"}}})

    # the trays: arm64 nodes whose GFD labels (clique included) reach the Node, 4 GPUs each
    for tray in trays:
        labels, capacity = wait_for(
            f"{tray}: GFD's labels with the NVLink clique and 4 GPUs",
            functools.partial(node_of, kube, tray),
            until=lambda s: (
                shapes.GPU_CLIQUE in s[0] and s[1].get(GPU) == "4" and s[0].get(STATE) == "success"
            ),
            timeout=240,
            context=operator.log_text,
        )
        assert labels["kubernetes.io/arch"] == "arm64" and labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    cliques = {node_of(kube, t)[0][shapes.GPU_CLIQUE] for t in trays}
    expected = {".".join(shapes.load("gb200-nvl72").fabric_ids(t) or ("", "")) for t in trays}
    assert cliques == expected and len(cliques) == 1, cliques  # one NVLink domain, one clique
    running = [
        p
        for p in kube.list(Pod, namespace="*", fields={"spec.nodeName": trays[0]})
        if p.status and p.status.phase == "Running"
    ]
    apps = {(p.metadata.labels or {}).get("app") for p in running if p.metadata}
    assert {"gpu-feature-discovery", "nvidia-device-plugin-daemonset", "nvidia-mig-manager"} <= apps, apps
    assert shapes.GPU_CLIQUE not in node_of(kube, a100)[0]

    # the A100 40GB takes its own profile: 7 x 1g.5gb per GPU
    kube.patch(Node, a100, {"metadata": {"labels": {MIG_CONFIG: "all-1g.5gb"}}})
    labels, capacity = wait_for(
        "all-1g.5gb on the A100",
        lambda: node_of(kube, a100),
        timeout=240,
        context=operator.log_text,
        until=lambda s: (
            s[0].get(STATE) == "success"
            and s[1].get(GPU) == "56"
            and s[0].get("nvidia.com/gpu.product", "").endswith("-MIG-1g.5gb")
        ),
    )
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.memory"] == "4864"

    # a B200 layout on a GB200: no such profile there, failed
    kube.patch(Node, trays[0], {"metadata": {"labels": {MIG_CONFIG: "all-1g.45gb"}}})
    wait_for(
        "all-1g.45gb failed on the GB200",
        lambda: node_of(kube, trays[0]),
        timeout=240,
        context=operator.log_text,
        until=lambda s: s[0].get(STATE) == "failed",
    )
    # and its own: 7 x 1g.23gb per GPU
    kube.patch(Node, trays[0], {"metadata": {"labels": {MIG_CONFIG: "all-1g.23gb"}}})
    labels, _ = wait_for(
        "all-1g.23gb on the GB200",
        lambda: node_of(kube, trays[0]),
        timeout=240,
        context=operator.log_text,
        until=lambda s: (
            s[0].get(STATE) == "success"
            and s[1].get(GPU) == "28"
            and s[0].get("nvidia.com/gpu.product", "").endswith("-MIG-1g.23gb")
        ),
    )
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200-MIG-1g.23gb"
    assert labels[shapes.GPU_CLIQUE] in cliques  # the fabric stays with MIG on


def test_rtx_pro_6000_advertises_its_gfx_profile_under_mixed(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
) -> None:
    """A profile with NVML's attribute suffix (+gfx) is a resource of its own under the device
    plugin's mixed strategy: 4 x 1g.24gb+gfx on each of 8 GPUs, nvidia.com/mig-1g.24gb.gfx: 32."""
    node = fake_nodes("rtx-pro-6000:1")[0]
    operator = start_operator()
    cluster_policies({"mig": {"strategy": "mixed"}, "migManager": {"config": {"default": "all-disabled"}}})
    wait_for(
        f"{node}: the MIG manager's all-disabled and 8 full GPUs",
        lambda: node_of(kube, node, "allocatable"),
        until=lambda s: s[0].get(STATE) == "success" and s[1].get(GPU) == "8",
        timeout=240,
        context=operator.log_text,
    )
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-1g.24gb.gfx"}}})
    labels, allocatable = wait_for(
        "all-1g.24gb.gfx on the RTX PRO 6000",
        lambda: node_of(kube, node, "allocatable"),
        timeout=240,
        context=operator.log_text,
        # the device plugin's resource and GFD's labels (which the operator mirrors) arrive apart
        until=lambda s: (
            s[0].get(STATE) == "success" and s[1].get(GFX) == "32" and s[0].get(f"{GFX}.count") == "32"
        ),
    )
    assert allocatable.get(GPU, "0") == "0", allocatable  # every GPU has MIG on: no full GPU left
    assert labels[f"{GFX}.product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-MIG-1g.24gb.gfx"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
