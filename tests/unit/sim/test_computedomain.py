"""The compute-domain stand-ins' rules (sim/standins/computedomain.py, sim/standins/computedomainplugin.py): the
objects the controller makes for a ComputeDomain, its global status, the node's clique, the kubelet
plugin's devices and its node label for the channel claims prepared there (only for a claim in its
domain's namespace)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from lightkube.models.core_v1 import Node as NodeModel
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from gpu_operator import shapes
from gpu_operator.sim.standins import computedomain as cd
from gpu_operator.sim.standins import computedomainplugin as cdp
from gpu_operator.sim.standins.podwatch import StandinNodeView

UID = "0b5c7e0a-1111-2222-3333-444455556666"
DOMAIN = {
    "metadata": {"name": "imex", "namespace": "team", "uid": UID},
    "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "imex-channel"}}},
}


def view(name: str, shape: str = "gb200-nvl72") -> StandinNodeView:
    return StandinNodeView(name=name, uid=f"uid-{name}", labels={}, capacity={}, shape=shapes.load(shape))


def test_the_controller_makes_the_templates_and_the_daemonset_of_a_domain() -> None:
    workload = cd.workload_template(DOMAIN)
    assert (workload["metadata"]["name"], workload["metadata"]["namespace"]) == ("imex-channel", "team")
    assert workload["metadata"]["labels"] == {cd.DOMAIN_LABEL: UID, cd.TARGET_LABEL: "Workload"}
    devices = workload["spec"]["spec"]["devices"]
    assert devices["requests"] == [{"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}]
    assert devices["config"][0]["opaque"]["parameters"] == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": UID,
        "allocationMode": "Single",
    }
    daemon = cd.daemon_template(UID, "gpu-operator")
    assert daemon["metadata"]["name"] == f"computedomain-daemon-{UID}"
    assert daemon["metadata"]["labels"][cd.TARGET_LABEL] == "Daemon"
    assert daemon["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == cd.DAEMON_CLASS
    ds = cd.daemonset(UID, "gpu-operator", "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0", "4")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {cd.DOMAIN_LABEL: UID} == ds["spec"]["selector"]["matchLabels"]
    assert pod["serviceAccountName"] == "compute-domain-daemon-service-account"
    assert pod["resourceClaims"] == [
        {"name": "compute-domain-daemon", "resourceClaimTemplateName": f"computedomain-daemon-{UID}"}
    ]
    assert {t["effect"] for t in pod["tolerations"]} == {"NoSchedule", "NoExecute", "PreferNoSchedule"}


def test_the_global_status() -> None:
    ready = {"status": "Ready"}
    assert cd.global_status([ready], 2) == "NotReady"  # fewer than numNodes
    assert cd.global_status([ready, {"status": "NotReady"}], 2) == "NotReady"
    assert cd.global_status([ready, ready], 2) == "Ready"
    assert cd.global_status([], 0) == "Ready"  # numNodes 0 (the default with DNS names)
    nodes = cd.nodes_from_cliques(
        [
            {
                "daemons": [
                    {
                        "nodeName": "b",
                        "ipAddress": "10.0.0.2",
                        "cliqueID": "x.1",
                        "index": 0,
                        "status": "Ready",
                    }
                ]
            },
            {
                "daemons": [
                    {
                        "nodeName": "a",
                        "ipAddress": "10.0.0.1",
                        "cliqueID": "y.1",
                        "index": 0,
                        "status": "Ready",
                    }
                ]
            },
        ]
    )
    assert [(n["name"], n["cliqueID"]) for n in nodes] == [("a", "y.1"), ("b", "x.1")]


def test_a_trays_clique_is_its_nvlink_domain() -> None:
    first, last, next_rack = (cd.clique_id(view(f"gb200-nvl72-{i}")) for i in (0, 17, 18))
    assert first == last and first != next_rack and first.endswith(".1")
    assert cd.clique_id(view("dgx-h100-0", "dgx-h100")) == ""  # NVLink inside the node: no fabric


def test_the_plugin_publishes_channel_0_and_daemon_0() -> None:
    body = cdp.ChannelPlugin().body(view("gb200-nvl72-3"))
    assert (
        body["spec"]["driver"] == "compute-domain.nvidia.com"
        and body["spec"]["pool"]["name"] == "gb200-nvl72-3"
    )
    assert [(d["name"], d["attributes"]["type"]["string"]) for d in body["spec"]["devices"]] == [
        ("channel-0", "channel"),
        ("daemon-0", "daemon"),
    ]


class FakeClient:
    """The calls the plugin's `prepare` makes: claims and domains listed, the Node got and updated."""

    def __init__(
        self, claims: list[dict[str, Any]], domains: dict[str, list[dict[str, Any]]], labels: dict[str, str]
    ) -> None:
        self.claims, self.domains = claims, domains
        self.node = Node(metadata=ObjectMeta(name="n1", labels=dict(labels)))
        self.updates: list[dict[str, str]] = []

    async def list(self, res: Any, namespace: str = "") -> AsyncIterator[dict[str, Any]]:
        items = self.claims if res is cd.ResourceClaim else self.domains.get(namespace, [])
        for item in items:
            yield item

    async def get(self, res: Any, name: str) -> NodeModel:
        return self.node

    async def replace(self, obj: Any) -> None:
        self.updates.append(dict(obj.metadata.labels or {}))


def claim(namespace: str, node: str = "n1", reserved: bool = True, domain: str = UID) -> dict[str, Any]:
    return {
        "metadata": {"name": "rank-0-imex", "namespace": namespace},
        "status": {
            "reservedFor": [{"resource": "pods", "name": "rank-0"}] if reserved else [],
            "allocation": {
                "devices": {
                    "results": [
                        {"driver": cd.DRIVER, "pool": node, "device": "channel-0", "request": "channel"}
                    ],
                    "config": [
                        {
                            "opaque": {
                                "driver": cd.DRIVER,
                                "parameters": {"kind": "ComputeDomainChannelConfig", "domainID": domain},
                            }
                        }
                    ],
                }
            },
        },
    }


def prepare(client: FakeClient, plugin: cdp.ChannelPlugin | None = None) -> list[dict[str, str]]:
    plugin = plugin or cdp.ChannelPlugin()
    plugin.claims = (-cd.POLL, [])  # listed afresh
    asyncio.run(plugin.prepare(client, "n1"))
    return client.updates


def test_the_plugin_labels_its_node_for_a_prepared_channel_claim_of_its_domains_namespace() -> None:
    domains = {"team": [DOMAIN]}
    assert prepare(FakeClient([claim("team")], domains, {})) == [{cd.DOMAIN_LABEL: UID}]
    assert prepare(FakeClient([claim("team")], domains, {cd.DOMAIN_LABEL: UID})) == []  # already there
    # not this node's, not yet reserved for its pod, or outside the domain's namespace: no label
    assert prepare(FakeClient([claim("team", node="n2")], domains, {})) == []
    assert prepare(FakeClient([claim("team", reserved=False)], domains, {})) == []
    assert prepare(FakeClient([claim("other")], domains, {})) == []
    # no claim of its domain left: the label it set taken back
    plugin = cdp.ChannelPlugin()
    client = FakeClient([claim("team")], domains, {"keep": "me"})
    assert prepare(client, plugin) == [{cd.DOMAIN_LABEL: UID, "keep": "me"}]
    client.claims, client.node = [], Node(metadata=ObjectMeta(name="n1", labels=client.updates[-1]))
    assert prepare(client, plugin)[-1] == {"keep": "me"}


def test_a_slice_left_from_before_a_restart_is_withdrawn_when_the_plugin_pod_is_gone() -> None:
    from lightkube.codecs import from_dict

    class Slices:
        def __init__(self) -> None:
            self.deleted: list[str] = []

        async def list(self, res: Any, labels: dict[str, str]) -> AsyncIterator[Any]:
            for driver, node in ((cd.DRIVER, "n1"), ("gpu.nvidia.com", "n2")):
                yield from_dict(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{node}-{driver}"},
                        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node}},
                    }
                )

        async def delete(self, res: Any, name: str) -> None:
            self.deleted.append(name)

    async def go() -> tuple[list[str], list[str]]:
        plugin, client = cdp.ChannelPlugin(), Slices()
        found = await plugin.start(client)
        for node in found:
            assert await plugin.sync(client, view(node), None) is None  # no plugin pod there any more
        return found, client.deleted

    assert asyncio.run(go()) == (["n1"], [f"n1-{cd.DRIVER}"])


def test_the_controller_drops_clique_entries_of_nodes_without_a_daemon_pod() -> None:
    from gpu_operator.kube.resources import ComputeDomainCliqueResource

    def entry(node: str, index: int) -> dict[str, Any]:
        return {
            "nodeName": node,
            "ipAddress": f"10.0.0.{index}",
            "cliqueID": "c.1",
            "index": index,
            "status": "Ready",
        }

    clique = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainClique",
        "metadata": {"name": f"{UID}.c.1", "namespace": "gpu-operator", "labels": {cd.DOMAIN_LABEL: UID}},
        "daemons": [entry("n1", 0), entry("n2", 1)],
    }
    domain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain", **DOMAIN}

    class Client:
        def __init__(self) -> None:
            self.replaced: list[dict[str, Any]] = []

        async def list(self, res: Any, namespace: str) -> AsyncIterator[dict[str, Any]]:
            yield clique if res is ComputeDomainCliqueResource else domain

        async def replace(self, obj: Any) -> None:
            self.replaced.append(obj.to_dict())

    client = Client()
    asyncio.run(cd.ComputeDomainController().statuses(client, "gpu-operator", [domain], {"n1"}))
    cleaned, status = client.replaced
    assert [d["nodeName"] for d in cleaned["daemons"]] == ["n1"]
    assert status["status"]["status"] == "NotReady"  # one node of numNodes 2
    assert [n["name"] for n in status["status"]["nodes"]] == ["n1"]
    assert status["metadata"]["name"] == "imex"
