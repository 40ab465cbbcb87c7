"""A ComputeDomain on GB200 NVL72 trays, end to end on the real control plane with the operator (real
process): the GPUCluster deploys the DRA driver with compute domains (the controller Deployment, the
kubelet plugin's compute-domains container); the controller's stand-in makes the domain's channel
claim template and IMEX DaemonSet; the real scheduler allocates two workload pods' channel claims
from the plugin's compute-domain.nvidia.com slices (one channel per node: two nodes); the plugin
labels those nodes with the domain, the DaemonSet's daemons land on exactly those nodes, record
themselves in their clique, and the domain turns Ready. Then a domain whose two workloads are on
trays of two NVLink domains: one ComputeDomainClique per clique, the nodes of both in its status,
Ready, as NVIDIA's driver reports it (sim/standins/computedomain.py; docs/simulator.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator import shapes
from gpu_operator.kube.resources import ComputeDomainCliqueResource, ComputeDomainResource
from gpu_operator.sim.plane import nodes as sim_nodes
from gpu_operator.sim.standins import computedomain as cd_sim
from gpu_operator.sim.standins import roster
from gpu_operator.sim.standins.identity import service_account_user
from tests.integration.test_gpucluster import IMAGE, Start, bring_up, exists, gpucluster  # noqa: F401
from tests.support.waiting import wait_for
from tests.support.workloads import claim_results

CHANNEL = "imex-channel"
# tray numbers: the first two in one NVLink domain (18 trays each, numbered in order), the third in
# the next; far above the session's other nodes (conftest's fake_nodes counts up in hundreds)
FIRST_TRAY = 9_000_000 + 16


@pytest.fixture
def trays(kube: Client) -> Iterator[list[str]]:
    names = sim_nodes.add_nodes(kube, ["gb200-nvl72:3"], start=FIRST_TRAY)
    try:
        sim_nodes.wait_ready(kube, names)
        yield names
    finally:
        sim_nodes.remove_nodes(kube, names)


def workload(kube: Client, namespace: str, name: str, hosts: list[str], channel: str = CHANNEL) -> None:
    """A pod of the domain's workload, with its channel claim, on one of `hosts`."""
    kube.create(
        from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "containers": [
                        {
                            "name": "mpi",
                            "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                            "resources": {"claims": [{"name": "imex"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": channel}],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": hosts,
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "terminationGracePeriodSeconds": 0,
                },
            }
        )
    )


def create_domain(kube: Client, namespace: str, name: str, channel: str) -> str:
    kube.create(
        from_dict(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": channel}}},
            }
        )
    )
    return str(domain(kube, namespace, name)["metadata"]["uid"])


def domain(kube: Client, namespace: str, name: str = "imex") -> dict[str, Any]:
    return dict(kube.get(ComputeDomainResource, name, namespace=namespace))


def cliques_of(kube: Client, namespace: str, uid: str) -> list[dict[str, Any]]:
    return [
        dict(c)
        for c in kube.list(ComputeDomainCliqueResource, namespace=namespace)
        if (c["metadata"].get("labels") or {}).get(cd_sim.DOMAIN_LABEL) == uid
    ]


def daemon_nodes(kube: Client, namespace: str, uid: str) -> dict[str, str]:
    """Running IMEX daemon pods of the domain by node."""
    return {
        str(p.spec.nodeName): str(p.metadata.name)
        for p in kube.list(Pod, namespace=namespace, labels={cd_sim.DOMAIN_LABEL: uid})
        if p.spec and p.spec.nodeName and p.status and p.status.phase == "Running"
    }


def test_a_compute_domain_gets_its_imex_daemons_on_its_workloads_nodes(
    kube: Client,
    trays: list[str],
    start_operator: Start,
    operator_namespace: str,
    gpucluster: Callable[[dict[str, Any]], None],  # noqa: F811
    namespace: str,
    node_standins: roster.StandIns,
) -> None:
    context = bring_up(kube, start_operator, gpucluster, {"draDriver": IMAGE})
    uid = create_domain(kube, namespace, "imex", CHANNEL)
    wait_for(
        "the channel claim template",
        lambda: exists(kube, cd_sim.ResourceClaimTemplate, CHANNEL, namespace),
        timeout=60,
        context=context,
    )
    ds_name = cd_sim.daemon_name(uid)
    wait_for("the IMEX DaemonSet", lambda: exists(kube, DaemonSet, ds_name, operator_namespace), timeout=30)
    ds = kube.get(DaemonSet, ds_name, namespace=operator_namespace)
    assert ds.spec.template.spec.nodeSelector == {cd_sim.DOMAIN_LABEL: uid}
    assert ds.spec.template.spec.serviceAccountName == cd_sim.DAEMON_ACCOUNT
    assert daemon_nodes(kube, operator_namespace, uid) == {}  # no node joined yet

    for name in ("rank-0", "rank-1"):
        workload(kube, namespace, name, trays[:2])

    def placed() -> dict[str, str]:
        found = {}
        for name in ("rank-0", "rank-1"):
            results = claim_results(kube, namespace, name)
            if results:
                (result,) = results
                assert result["driver"] == cd_sim.DRIVER and result["device"] == "channel-0", result
                found[name] = str(result["pool"])
        return found

    pools = wait_for(
        "both channel claims allocated", placed, until=lambda p: len(p) == 2, timeout=60, context=context
    )
    chosen = set(pools.values())
    assert chosen == set(trays[:2]), pools  # one channel per node: both of the two trays allowed
    for name, node in pools.items():
        assert kube.get(Pod, name, namespace=namespace).spec.nodeName == node

    daemons = wait_for(
        "IMEX daemons on the workloads' nodes",
        lambda: daemon_nodes(kube, operator_namespace, uid),
        until=lambda d: set(d) == chosen,
        timeout=60,
        context=context,
    )
    for node in trays:
        labels = kube.get(Node, node).metadata.labels or {}
        assert (labels.get(cd_sim.DOMAIN_LABEL) == uid) == (node in chosen), (node, labels)

    status = wait_for(
        "the ComputeDomain Ready",
        lambda: domain(kube, namespace).get("status") or {},
        until=lambda s: s.get("status") == "Ready",
        timeout=60,
        context=context,
    )
    fabric = shapes.load("gb200-nvl72")
    cliques = {node: ".".join(fabric.fabric_ids(node) or ()) for node in chosen}
    assert len(set(cliques.values())) == 1  # the trays of one NVLink domain: one clique
    assert {n["name"]: n["cliqueID"] for n in status["nodes"]} == cliques
    assert sorted(n["index"] for n in status["nodes"]) == [0, 1]
    (clique,) = cliques_of(kube, operator_namespace, uid)
    assert clique["metadata"]["name"] == f"{uid}.{next(iter(cliques.values()))}"
    for node, pod in daemons.items():
        labels = kube.get(Pod, pod, namespace=operator_namespace).metadata.labels or {}
        assert labels.get(cd_sim.CLIQUE_LABEL) == cliques[node], (pod, labels)

    # the workloads go: the nodes' labels are taken back; the domain goes: its DaemonSet and templates
    for name in ("rank-0", "rank-1"):
        kube.delete(Pod, name, namespace=namespace)
    wait_for(
        "the domain label taken back",
        lambda: [n for n in trays if cd_sim.DOMAIN_LABEL in (kube.get(Node, n).metadata.labels or {})],
        until=lambda left: not left,
        timeout=60,
        context=context,
    )
    # their daemons go with the label: the domain's nodes with them, its clique with its last owner
    wait_for(
        "the domain without nodes",
        lambda: domain(kube, namespace).get("status") or {},
        until=lambda s: s.get("nodes") == [] and s.get("status") == "NotReady",
        timeout=60,
        context=context,
    )
    wait_for(
        "the clique collected",
        lambda: cliques_of(kube, operator_namespace, uid),
        until=lambda c: c == [],
        timeout=60,
        context=context,
    )
    kube.delete(ComputeDomainResource, "imex", namespace=namespace)
    # the controller deletes them one after the other: wait for both
    wait_for(
        "the IMEX DaemonSet and the channel template deleted",
        lambda: [
            what
            for what, there in (
                ("DaemonSet", exists(kube, DaemonSet, ds_name, operator_namespace)),
                ("template", exists(kube, cd_sim.ResourceClaimTemplate, CHANNEL, namespace)),
            )
            if there
        ],
        until=lambda left: not left,
        timeout=60,
        context=context,
    )

    # a domain over two NVLink domains: its daemons in two cliques, both in its status, as NVIDIA's
    # driver reports it (each clique an IMEX domain of its own; nothing refused)
    uid = create_domain(kube, namespace, "imex-2", "imex-channel-2")
    wait_for(
        "the second channel claim template",
        lambda: exists(kube, cd_sim.ResourceClaimTemplate, "imex-channel-2", namespace),
        timeout=60,
    )
    workload(kube, namespace, "split-0", [trays[1]], "imex-channel-2")
    workload(kube, namespace, "split-1", [trays[2]], "imex-channel-2")
    wait_for(
        "IMEX daemons on both cliques' trays",
        lambda: daemon_nodes(kube, operator_namespace, uid),
        until=lambda d: set(d) == set(trays[1:]),
        timeout=60,
        context=context,
    )
    status = wait_for(
        "the split ComputeDomain's nodes",
        lambda: domain(kube, namespace, "imex-2").get("status") or {},
        until=lambda s: len(s.get("nodes") or []) == 2,
        timeout=60,
        context=context,
    )
    split = {n["name"]: n["cliqueID"] for n in status["nodes"]}
    assert split == {node: ".".join(fabric.fabric_ids(node) or ()) for node in trays[1:]}
    assert len(set(split.values())) == 2 and status["status"] == "Ready"
    assert sorted(c["metadata"]["name"] for c in cliques_of(kube, operator_namespace, uid)) == sorted(
        f"{uid}.{clique}" for clique in split.values()
    )
    assert sorted(n["index"] for n in status["nodes"]) == [0, 0]  # an index per clique

    # every call went through with the rendered RBAC of the three identities
    accounts = {
        service_account_user(operator_namespace, a)
        for a in ("nvidia-dra-driver-controller", "nvidia-dra-driver-kubeletplugin", cd_sim.DAEMON_ACCOUNT)
    }
    assert node_standins.identities is not None
    refused = [r.record() for r in node_standins.identities.refusals.seen if r.identity in accounts]
    assert refused == [], refused
