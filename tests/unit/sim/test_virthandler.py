"""KubeVirt's virt-handler device plugin stand-in without a cluster: which devices it counts (the
permitted PCI ID on vfio-pci, not on nvidia; none for an external provider), health from
/dev/vfio/<group>, the Node's capacity and allocatable, and the kubelet's allocation to a VM's pod
in its checkpoint."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from gpu_operator import shapes
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.hardware.faults import NodeHosts, node_host_spec
from gpu_operator.sim.standins import virthandler
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView

NODE = "vfio-passthrough-0"
RESOURCE = "nvidia.com/H100_SXM5_80GB"
SEED: dict[str, Any] = {
    "pciVendorSelector": "10DE:2330",
    "resourceName": "nvidia.com/H100_SXM5_80GB",
    "externalResourceProvider": False,
}


def kubevirt(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": list(entries)}}}}


def pod(app: str, uid: str = "h-1", running: bool = True, limits: dict[str, str] | None = None) -> PodView:
    container: dict[str, Any] = {"name": "compute" if limits else app, "image": app}
    if limits:
        container["resources"] = {"limits": limits, "requests": limits}
    return PodView.of(
        Pod.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{app}-x",
                    "namespace": "cozy-kubevirt",
                    "uid": uid,
                    "labels": {"kubevirt.io": app},
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "spec": {"nodeName": NODE, "containers": [container]},
                "status": {"phase": "Running" if running else "Pending"},
            }
        ),
        label="kubevirt.io",
    )


def view() -> StandinNodeView:
    return StandinNodeView(
        name=NODE,
        uid="n",
        labels={shapes.SHAPE_LABEL: "vfio-passthrough"},
        capacity={},
        shape=shapes.load("vfio-passthrough"),
    )


class Client:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    async def patch(self, resource: Any, name: str, body: Any, **kwargs: Any) -> None:
        assert kwargs["field_manager"] == "kubelet"
        self.patches.append(body["status"])


@pytest.fixture
def hosts(tmp_path: Path) -> Path:
    spec = node_host_spec("vfio-passthrough")
    spec["devices"][7]["driver"] = "nvidia"  # one GPU left on the host driver
    NodeHosts(tmp_path).faults(NODE, spec)
    return tmp_path


def test_the_pod_label_and_the_limits_are_read() -> None:
    seen = pod("virt-launcher", limits={"nvidia.com/H100_SXM5_80GB": "2", "cpu": "4"})
    assert seen.app == "virt-launcher" and seen.devices == (("compute", "nvidia.com/H100_SXM5_80GB", 2),)


def test_permitted_skips_external_providers() -> None:
    other = {
        "pciVendorSelector": "10DE:2331",
        "resourceName": "nvidia.com/H100_PCIE",
        "externalResourceProvider": True,
    }
    assert virthandler.permitted(kubevirt(SEED, other)) == {"10de:2330": "nvidia.com/H100_SXM5_80GB"}
    assert virthandler.permitted(None) == {}


def test_only_devices_on_vfio_pci_with_a_group_are_counted(hosts: Path) -> None:
    root = NodeHosts(hosts).root(NODE)
    found = virthandler.discover(root, {"10de:2330": "nvidia.com/H100_SXM5_80GB"})
    devices = found["nvidia.com/H100_SXM5_80GB"]
    assert len(devices) == 7  # the eighth is on nvidia
    assert {d.driver for d in devices} == {"vfio-pci"}
    first = devices[0]
    assert virthandler.group_addresses(root, first.group) == [first.address]
    assert virthandler.discover(root, {"10de:2331": "x/y"}) == {}


def test_capacity_allocatable_and_health(hosts: Path) -> None:
    handler = virthandler.VirtHandler(hosts)
    handler.kubevirts["cozy-kubevirt"] = kubevirt(SEED)
    client = Client()
    asyncio.run(handler.sync(client, NODE, view(), [pod("virt-handler")]))  # type: ignore[arg-type]
    assert client.patches[-1] == {"capacity": {RESOURCE: "7"}, "allocatable": {RESOURCE: "7"}}
    # a group file gone while the plugin watches: that device Unhealthy, still in capacity
    group = handler.nodes[NODE].plugins[RESOURCE].devices[0].group
    os.unlink(NodeHosts(hosts).root(NODE) / "dev" / "vfio" / group)
    asyncio.run(handler.sync(client, NODE, view(), [pod("virt-handler")]))  # type: ignore[arg-type]
    assert client.patches[-1]["allocatable"] == {RESOURCE: "6"}
    # a new virt-handler pod: its plugin cannot watch the missing file and keeps restarting
    asyncio.run(handler.sync(client, NODE, view(), [pod("virt-handler", uid="h-2")]))  # type: ignore[arg-type]
    assert client.patches[-1] == {"capacity": {RESOURCE: "7"}, "allocatable": {RESOURCE: "0"}}
    # the entry removed from the CR: the plugin stops, allocatable 0 while capacity stays
    handler.kubevirts["cozy-kubevirt"] = kubevirt()
    asyncio.run(handler.sync(client, NODE, view(), [pod("virt-handler", uid="h-2")]))  # type: ignore[arg-type]
    assert client.patches[-1] == {"capacity": {RESOURCE: "7"}, "allocatable": {RESOURCE: "0"}}


def test_no_pod_no_plugin(hosts: Path) -> None:
    handler = virthandler.VirtHandler(hosts)
    handler.kubevirts["cozy-kubevirt"] = kubevirt(SEED)
    client = Client()
    asyncio.run(handler.sync(client, NODE, view(), [pod("virt-handler", running=False)]))  # type: ignore[arg-type]
    assert client.patches == []


def test_the_vms_pod_gets_free_devices_recorded_in_the_checkpoint(hosts: Path) -> None:
    handler = virthandler.VirtHandler(hosts)
    handler.kubevirts["cozy-kubevirt"] = kubevirt(SEED)
    kubelet = virthandler.LauncherAllocations(handler, hosts)
    asyncio.run(handler.sync(Client(), NODE, view(), [pod("virt-handler")]))  # type: ignore[arg-type]
    vms = [
        pod("virt-launcher", uid="vm-1", limits={RESOURCE: "2"}),
        pod("virt-launcher", uid="vm-2", limits={RESOURCE: "3"}),
    ]
    asyncio.run(kubelet.sync(Client(), NODE, view(), vms))  # type: ignore[arg-type]
    root = NodeHosts(hosts).root(NODE)
    entries = {e["PodUID"]: e for e in virthandler.read_checkpoint(root)}
    first, second = (entries[u]["DeviceIDs"]["-1"] for u in ("vm-1", "vm-2"))
    assert len(first) == 2 and len(second) == 3 and not set(first) & set(second)
    assert entries["vm-1"]["ContainerName"] == "compute"
    # one VM goes: its devices are free again
    asyncio.run(kubelet.sync(Client(), NODE, view(), vms[1:]))  # type: ignore[arg-type]
    assert [e["PodUID"] for e in virthandler.read_checkpoint(root)] == ["vm-2"]


def test_a_tree_built_with_vfio_devices_has_their_group_files(tmp_path: Path) -> None:
    fs = hosttree.build(node_host_spec("vfio-passthrough"), tmp_path)
    groups = sorted(os.listdir(fs.resolve("/dev/vfio")))
    assert "vfio" in groups and len(groups) == 9


def test_the_stand_ins_watch_kubevirts_pods_by_their_own_label(tmp_path: Path) -> None:
    from gpu_operator.sim.standins.podwatch import NodeStandIns
    from gpu_operator.sim.standins.roster import default_players

    standins = NodeStandIns(Client(), default_players(hosts=tmp_path))  # type: ignore[arg-type]
    assert [sorted(w.labels) for w in standins.watches] == [["app"], ["kubevirt.io"]]
