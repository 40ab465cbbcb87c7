"""MIG end to end on kwok nodes, on the real control plane: the operator (real process) deploys the
MIG manager, GFD and the device plugin; the simulator's stand-ins play them (sim/standins/migmanager.py,
sim/standins/gfd.py, sim/standins/kubeletdp.py). A change of `nvidia.com/mig.config` goes pending -> GPU clients
paused -> layout applied -> success with the clients back; GFD's MIG labels reach the Node
through its NodeFeature (the operator mirrors them) and the kubelet's capacity follows the device
plugin's MIG strategy; a layout the GPU cannot take ends `failed`, with the clients back too."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.waiting import wait_for

MIG_CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
GPU = "nvidia.com/gpu"
MIG_1G = "nvidia.com/mig-1g.10gb"


class History:
    """Every (mig.config.state, device-plugin deploy label) a watch of one Node saw, in order."""

    def __init__(self, plane: ControlPlane, node: str) -> None:
        self.seen: list[tuple[str | None, str | None]] = []
        self.client = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="tests")
        self.node, self.stop = node, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for _kind, obj in self.client.watch(Node, fields={"metadata.name": self.node}):
                    labels = (obj.metadata.labels if obj.metadata else None) or {}
                    entry = (labels.get(STATE), labels.get(DEVICE_PLUGIN))
                    if not self.seen or self.seen[-1] != entry:
                        self.seen.append(entry)
                    if self.stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - the watch ended: watch again
                continue

    def since(self, mark: int) -> list[tuple[str | None, str | None]]:
        return self.seen[mark:]


@pytest.fixture
def history(control_plane: ControlPlane) -> Iterator[Callable[[str], History]]:
    made: list[History] = []

    def start(node: str) -> History:
        h = History(control_plane, node)
        h.thread.start()
        made.append(h)
        return h

    yield start
    for h in made:
        h.stop.set()
        h.client.close()


def node_state(kube: Client, name: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    node = kube.get(Node, name)
    status = node.status
    return (
        dict(node.metadata.labels or {}) if node.metadata else {},
        {k: str(v) for k, v in ((status.capacity if status else None) or {}).items()},
        {k: str(v) for k, v in ((status.allocatable if status else None) or {}).items()},
    )


def test_a_mig_config_change_is_applied_and_advertised_per_strategy(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    history: Callable[[str], History],
) -> None:
    node = fake_nodes("dgx-h100:1")[0]
    seen = history(node)
    operator = start_operator()
    # the chart's default: the operator labels MIG-capable nodes nvidia.com/mig.config=all-disabled
    cluster_policies({"mig": {"strategy": "single"}, "migManager": {"config": {"default": "all-disabled"}}})

    def state() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        return node_state(kube, node)

    # the operator's default (all-disabled) is what the GPUs have: success at once, nothing paused
    labels, capacity, _ = wait_for(
        "the MIG manager's first pass and the GPUs' capacity",
        state,
        until=lambda s: s[0].get(STATE) == "success" and s[1].get(GPU) == "8",
        timeout=180,
        context=operator.log_text,
    )
    assert labels[MIG_CONFIG] == "all-disabled" and labels["nvidia.com/mig.strategy"] == "single"
    assert all(dp != "paused-for-mig-change" for _, dp in seen.seen), seen.seen

    mark = len(seen.seen)
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    labels, capacity, allocatable = wait_for(
        "all-1g.10gb applied and advertised as nvidia.com/gpu (single)",
        state,
        timeout=180,
        context=operator.log_text,
        until=lambda s: (
            s[0].get(STATE) == "success"
            and s[1].get(GPU) == "56"
            and s[0].get("nvidia.com/gpu.product", "").endswith("-MIG-1g.10gb")
        ),
    )
    assert allocatable[GPU] == "56"
    # the Node watch is a channel of its own: it may see the end after the GET above did
    steps = wait_for(
        "the watch to see success with the clients back",
        lambda: seen.since(mark),
        timeout=30,
        until=lambda st: ("success", "true") in st,
    )
    assert ("pending", "paused-for-mig-change") in steps, steps
    assert steps.index(("pending", "paused-for-mig-change")) < steps.index(("success", "true")), steps
    assert labels[DEVICE_PLUGIN] == "true" and labels[GFD] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "56" and labels["nvidia.com/gpu.memory"] == "10240"
    assert labels["nvidia.com/gpu.slices.gi"] == "1" and labels["nvidia.com/gpu.multiprocessors"] == "16"

    # mixed: the device plugin and GFD re-rendered with MIG_STRATEGY=mixed
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"mig": {"strategy": "mixed"}}},
        patch_type=PatchType.MERGE,
    )
    labels, capacity, allocatable = wait_for(
        "the MIG devices as nvidia.com/mig-1g.10gb (mixed)",
        state,
        timeout=180,
        context=operator.log_text,
        until=lambda s: s[1].get(MIG_1G) == "56" and s[0].get(f"{MIG_1G}.count") == "56",
    )
    assert allocatable[MIG_1G] == "56" and labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels[f"{MIG_1G}.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert allocatable.get(GPU) == "0"  # no full GPU left: that endpoint stopped (kept in capacity a while)

    # back to full GPUs
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-disabled"}}})
    labels, capacity, allocatable = wait_for(
        "all-disabled: the 8 GPUs back",
        state,
        timeout=180,
        context=operator.log_text,
        until=lambda s: (
            s[0].get(STATE) == "success" and s[2].get(GPU) == "8" and f"{MIG_1G}.count" not in s[0]
        ),
    )
    assert allocatable.get(MIG_1G) == "0" and capacity[GPU] == "8"

    # a layout the H100 cannot take (an A100 profile): failed, the clients restored
    mark = len(seen.seen)
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-1g.5gb"}}})
    labels, _, _ = wait_for(
        "all-1g.5gb failed",
        state,
        timeout=180,
        context=operator.log_text,
        until=lambda s: s[0].get(STATE) == "failed",
    )
    steps = wait_for(
        "the watch to see failed with the clients restored",
        lambda: seen.since(mark),
        timeout=30,
        until=lambda st: bool(st) and st[-1] == ("failed", "true"),
    )
    assert ("pending", "paused-for-mig-change") in steps, steps
    # a config the file does not have: failed at once, nothing paused
    mark = len(seen.seen)
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "no-such-layout", STATE: "x"}}})
    wait_for(
        "an unknown config failed",
        state,
        timeout=60,
        context=operator.log_text,
        until=lambda s: s[0].get(STATE) == "failed",
    )
    # the watch's last view is failed (a new entry only where it differs from the one before)
    wait_for(
        "the watch to see it failed",
        lambda: seen.seen[-1:],
        timeout=30,
        until=lambda last: last == [("failed", "true")],
    )
    assert all(dp == "true" for _, dp in seen.since(mark)), seen.since(mark)
