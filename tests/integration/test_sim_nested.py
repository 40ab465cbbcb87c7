"""Seed 001 end to end on two simulators (`sim demo --nested`, sim/commands/nested.py): the host cluster's
seed-001 node publishes `nvidia.com/H100_SXM5_80GB: 8` through virt-handler's device plugin once
our operator has listed the GPUs in KubeVirt's CR; a VM's pod gets 2 of them; the cluster inside
that VM, whose node's host tree holds exactly those 2 GPUs at the guest's addresses, runs our chart
with the platform package's guest values to a ready ClusterPolicy and `nvidia.com/gpu: 2`.

Cost: two control planes, two Helm installs, two operators: ~100 s on 2 busy cores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.commands import nested, session
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware import guesttree
from gpu_operator.sim.hardware.faults import NodeHosts
from gpu_operator.sim.standins.virthandler import read_checkpoint

pytestmark = pytest.mark.integration

SEED_001 = {f"0000:{bus}:00.0" for bus in nested.SEED_001}


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nested.Chain]:
    where = tmp_path_factory.mktemp("nested")
    lines: list[str] = []
    try:
        yield nested.run(where, lines.append, gpus=2, keep=True, timeout=150)
    finally:
        for part in ("guest", "host"):
            session.down(where / part, lines.append)


def client(state: SimState | None) -> Client:
    assert state is not None
    return Client(KubeConfig.from_file(state.kubeconfig))


def test_the_host_publishes_what_kubevirt_permits(chain: nested.Chain) -> None:
    kube = client(chain.host)
    node = kube.get(Node, nested.HOST_NODE)
    assert node.status is not None
    assert (node.status.capacity or {})["nvidia.com/H100_SXM5_80GB"] == "8"
    assert (node.status.allocatable or {})["nvidia.com/H100_SXM5_80GB"] == "8"
    assert chain.host_resource == nested.SEED_001_RESOURCE


def test_the_vm_gets_two_of_seed_001s_gpus(chain: nested.Chain) -> None:
    assert chain.host is not None
    root = NodeHosts(Path(chain.host.dir) / "hosts").root(nested.HOST_NODE)
    (entry,) = read_checkpoint(root)
    assert entry["ResourceName"] == nested.SEED_001_RESOURCE and entry["ContainerName"] == "compute"
    (groups,) = entry["DeviceIDs"].values()
    assert len(groups) == 2 and groups == chain.groups
    assert len(chain.host_addresses) == 2 and set(chain.host_addresses) <= SEED_001


def test_the_guest_node_has_exactly_those_gpus_and_the_policy_is_ready(chain: nested.Chain) -> None:
    assert chain.guest is not None
    root = NodeHosts(Path(chain.guest.dir) / "hosts").root(nested.VM_NAME)
    gpus = sorted(
        p.name
        for p in (root / "sys/bus/pci/devices").iterdir()
        if (p / "vendor").read_text().strip() == "0x10de"
    )
    assert gpus == guesttree.gpu_addresses(2) == chain.guest_addresses
    kube = client(chain.guest)
    node = kube.get(Node, nested.VM_NAME)
    assert node.status is not None and (node.status.allocatable or {})["nvidia.com/gpu"] == "2"
    policy = json.loads(json.dumps(dict(kube.get(ClusterPolicyResource, "cluster-policy"))))
    assert policy["status"]["state"] == "ready"
