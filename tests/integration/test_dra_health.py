"""GPU health on the DRA stack (GPUCluster), end to end on a control plane of its own: the operator
process, the GPUCluster's DaemonSets on a kwok GPU node, the simulator's stand-ins over the node's
host tree (the DRA kubelet plugin's ResourceSlice, our health agent in the DRA validator's pod),
faults by the simulator's injection. A fault on one GPU -> that device is no longer allocated to a
new ResourceClaim; `--clear` (a reboot) -> allocatable again. Two ways, one control plane each:

- device-taint-rules: Kubernetes' defaults, which serve DeviceTaintRule (GA in 1.37:
  resource.k8s.io/v1, no feature gate or runtime config): the operator keeps one rule for the sick
  GPU (controllers/units/health/dra.py);
- plugin-health-check: a plane without DeviceTaintRule (resource.k8s.io/v1/devicetaintrules off,
  the gate DRADeviceTaintRules off: as 1.36's defaults), the DRA driver's gate NVMLDeviceHealthCheck on: the plugin (its stand-in,
  sim/standins/drahealth.py) taints the device in its ResourceSlice, which the scheduler honours
  (DRADeviceTaints, GA in 1.37).

Which version of DeviceTaintRule the operator writes comes from discovery: v1 where served, else
v1beta2 (Kubernetes 1.36 with resource.k8s.io/v1beta2 on); a plane serving only v1beta2 holds that.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from gpu_operator import shapes
from gpu_operator.api.health import HealthReport
from gpu_operator.controllers.units.health import dra as health_dra
from gpu_operator.controllers.units.health.dra import PCI_BUS_ID
from gpu_operator.kube import devicetaints
from gpu_operator.kube.client import GPUClusterResource, Kube
from gpu_operator.kube.crds import apply_crds
from gpu_operator.render.states.mig_manager import default_mig_config
from gpu_operator.sim.commands.faultinject import inject
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware import mighw, migparted
from gpu_operator.sim.plane import binaries
from gpu_operator.sim.plane import nodes as sim_nodes
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.standins import draplugin, roster
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_REPORT_ANNOTATION, HEALTH_TAINT, MANAGED_SELECTOR
from tests.support import workloads
from tests.support.waiting import wait_for

SHAPE = "a10"  # two GPUs
IMAGE = {"repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu", "version": "v0.5.0"}
WAIT = 120.0
DeviceTaintRule = create_global_resource("resource.k8s.io", "v1", "DeviceTaintRule", "devicetaintrules")
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


@dataclass
class Stack:
    way: str
    kube: Client
    node: str
    namespace: str
    sim: SimState
    operator: OperatorProcess

    def logs(self) -> str:
        return self.operator.log_text()[-4000:]

    def fault(self, action: str, xid: int | None = None, gpu: int | None = None) -> None:
        inject(self.sim, self.node, action, xid, gpu)

    def report(self) -> HealthReport | None:
        text = (self.kube.get(Node, self.node).metadata.annotations or {}).get(HEALTH_REPORT_ANNOTATION)
        return HealthReport.parse(text) if text else None

    def condition(self) -> tuple[str, str] | None:
        status = self.kube.get(Node, self.node).status
        found = [c for c in (status.conditions if status else None) or [] if c.type == HEALTH_CONDITION]
        return (found[0].status, str(found[0].reason)) if found else None

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        """The node's GPU devices (driver gpu.nvidia.com; the compute-domain side's channel and
        daemon devices are another driver's slice)."""
        out: dict[str, dict[str, Any]] = {}
        for found in self.kube.list(ResourceSlice):
            if found["spec"].get("nodeName") == self.node and found["spec"].get("driver") == "gpu.nvidia.com":
                out.update({d["name"]: d for d in found["spec"].get("devices") or []})
        return out

    def rules(self) -> dict[str, dict[str, Any]]:
        if self.way != "device-taint-rules":
            return {}
        return {r["metadata"]["name"]: r for r in self.kube.list(DeviceTaintRule)}


def start_plane(way: str, base: Path) -> ControlPlane:
    found = binaries.locate(build=True).of("current")
    extra: dict[str, Any] = {}
    if way == "plugin-health-check":
        # as 1.36's defaults: no DeviceTaintRule served, nor watched by the scheduler and controllers
        extra = {
            "feature_gates": {"DRADeviceTaintRules": False},
            "runtime_config": ("resource.k8s.io/v1/devicetaintrules=false",),
        }
    return ControlPlane(base / "plane", found, **extra).start()


@pytest.fixture(scope="module", params=["device-taint-rules", "plugin-health-check"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    way = request.param
    base = tmp_path_factory.mktemp(f"dra-health-{way}")
    plane = start_plane(way, base)
    operator: OperatorProcess | None = None
    try:
        kube = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="tests")
        apply_crds(kube)
        namespace = f"gpu-operator-{uuid.uuid4().hex[:6]}"
        kube.create(Namespace(metadata={"name": namespace}))  # type: ignore[arg-type]
        (node,) = sim_nodes.add_nodes(kube, [f"{SHAPE}:1"], start=95_000)
        sim_nodes.wait_ready(kube, [node])
        sim = SimState(
            dir=str(base), server=plane.server, kubeconfig=str(plane.admin_kubeconfig), binaries=""
        )
        with roster.running(KubeConfig.from_file(plane.admin_kubeconfig), hosts=base / "hosts") as running:
            operator = OperatorProcess(
                kubeconfig=plane.kubeconfig_for("operator"), namespace=namespace, log=base / "operator.log"
            ).start()
            driver: dict[str, Any] = dict(IMAGE)
            if way == "plugin-health-check":
                driver["featureGates"] = {"NVMLDeviceHealthCheck": True}
            kube.create(
                from_dict(
                    {
                        "apiVersion": "nvidia.com/v1alpha1",
                        "kind": "GPUCluster",
                        "metadata": {"name": "gpu-cluster"},
                        "spec": {"draDriver": driver},
                    }
                )
            )
            found = Stack(way, kube, node, namespace, sim, operator)
            wait_for(
                "GPUCluster ready",
                lambda: kube.get(GPUClusterResource, "gpu-cluster").get("status") or {},
                until=lambda s: s.get("state") == "ready",
                timeout=180,
                context=found.logs,
            )
            wait_for("both GPUs published", found.slice_devices, until=lambda d: len(d) == 2, timeout=WAIT)
            wait_for(
                "the agent's first report: healthy, GPUsHealthy",
                found.condition,
                until=lambda c: c == ("True", "GPUsHealthy"),
                timeout=WAIT,
                context=found.logs,
            )
            yield found
        assert running.error is None, f"the stand-ins failed: {running.error!r}"
    finally:
        if operator is not None and operator.alive:
            operator.stop()
        plane.stop()


def claim_pod(kube: Client, namespace: str, name: str, count: int) -> None:
    # the node's quarantine taint tolerated: what is refused here is the device
    workloads.claim_pod(
        kube, namespace, name, count, tolerations=({"key": HEALTH_TAINT, "operator": "Exists"},)
    )


def allocated(kube: Client, namespace: str, pod: str) -> list[str]:
    """The devices of the pod's allocated claim ([] until it is allocated)."""
    return sorted(str(r["device"]) for r in workloads.claim_results(kube, namespace, pod))


def unschedulable(kube: Client, namespace: str, pod: str) -> bool:
    status = kube.get(Pod, pod, namespace=namespace).status
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in (status.conditions if status else None) or []
    )


def delete_pod(kube: Client, namespace: str, name: str) -> None:
    kube.delete(Pod, name, namespace=namespace, grace_period=0)

    def gone() -> bool:
        try:
            kube.get(Pod, name, namespace=namespace)
        except ApiError as err:
            return err.status.code == 404
        return False

    wait_for(f"pod {name} gone", gone, timeout=WAIT)


def test_a_sick_gpu_is_not_allocated_until_the_node_is_healthy_again(stack: Stack) -> None:
    kube, ns = stack.kube, stack.namespace
    devices = stack.slice_devices()
    bus1 = devices["gpu-1"]["attributes"][PCI_BUS_ID]["string"]
    claim_pod(kube, ns, "both-before", 2)  # both GPUs can be had before the fault
    assert wait_for("both GPUs allocated", lambda: allocated(kube, ns, "both-before"), timeout=WAIT) == [
        "gpu-0",
        "gpu-1",
    ]
    delete_pod(kube, ns, "both-before")

    stack.fault("xid", 79, 1)
    report = wait_for(
        "the agent reports GPU 1 unhealthy",
        stack.report,
        until=lambda r: r is not None and [g.bus for g in r.unhealthy] == [bus1],
        timeout=WAIT,
    )
    assert report is not None and report.unhealthy[0].xid == 79
    if stack.way == "device-taint-rules":
        rules = wait_for(
            "the operator's DeviceTaintRule", stack.rules, until=bool, timeout=WAIT, context=stack.logs
        )
        assert list(rules) == [f"gpu-health-{stack.node}-gpu-1"]
        spec = next(iter(rules.values()))["spec"]
        assert spec["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": stack.node, "device": "gpu-1"}
        assert spec["taint"]["key"] == HEALTH_TAINT and spec["taint"]["effect"] == "NoSchedule"
        assert all("taints" not in d for d in stack.slice_devices().values())  # the plugin's gate is off
    else:
        slice_taints = wait_for(
            "the plugin's taint on gpu-1", lambda: stack.slice_devices()["gpu-1"].get("taints"), timeout=WAIT
        )
        assert [(t["key"], t["value"], t["effect"]) for t in slice_taints] == [
            ("gpu.nvidia.com/xid", "79", "NoSchedule")
        ]
        assert "taints" not in stack.slice_devices()["gpu-0"]
        assert stack.rules() == {}  # no DeviceTaintRule API here

    claim_pod(kube, ns, "both-during", 2)
    wait_for("a claim for both GPUs refused", lambda: unschedulable(kube, ns, "both-during"), timeout=WAIT)
    claim_pod(kube, ns, "one-during", 1)
    assert wait_for("one GPU allocated", lambda: allocated(kube, ns, "one-during"), timeout=WAIT) == ["gpu-0"]
    assert allocated(kube, ns, "both-during") == []

    delete_pod(kube, ns, "one-during")
    stack.fault("clear")  # a reboot
    wait_for(
        "the agent reports every GPU healthy",
        stack.report,
        until=lambda r: r is not None and not r.unhealthy,
        timeout=WAIT,
    )
    if stack.way == "device-taint-rules":
        wait_for(
            "the DeviceTaintRule deleted",
            stack.rules,
            until=lambda r: r == {},
            timeout=WAIT,
            context=stack.logs,
        )
    else:
        wait_for(
            "the slice without taints",
            stack.slice_devices,
            until=lambda d: all("taints" not in v for v in d.values()),
            timeout=WAIT,
        )
    assert wait_for(
        "both GPUs allocated again", lambda: allocated(kube, ns, "both-during"), timeout=WAIT
    ) == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize("stack", ["device-taint-rules"], indirect=True)  # the plane that serves the API
def test_the_rules_go_with_the_gpucluster(stack: Stack) -> None:
    assert stack.way == "device-taint-rules"
    stack.fault("xid", 79, 0)
    rules = wait_for(
        "the operator's DeviceTaintRule", stack.rules, until=bool, timeout=WAIT, context=stack.logs
    )
    owner = next(iter(rules.values()))["metadata"]["ownerReferences"][0]
    gpucluster = stack.kube.get(GPUClusterResource, "gpu-cluster")
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "GPUCluster",
        "gpu-cluster",
        gpucluster["metadata"]["uid"],
    )
    stack.kube.delete(GPUClusterResource, "gpu-cluster")
    wait_for(
        "the rule collected with the GPUCluster",
        stack.rules,
        until=lambda r: r == {},
        timeout=WAIT,
        context=stack.logs,
    )


@pytest.mark.parametrize("stack", ["plugin-health-check"], indirect=True)  # any plane with host trees
def test_mig_devices_are_published_and_a_claim_for_one_is_allocated(stack: Stack) -> None:
    """The GPUCluster stack deploys no MIG manager (NVIDIA's drops its deploy label): the layout is
    made on the node's GPUs by hand (the simulator's MIG state beside the host tree), and the
    plugin, which reads NVML when it starts, is restarted to publish it. Then the plugin's
    DynamicMIG gate: partitionable devices, and a claim for a MIG device gets a placement."""
    kube, ns = stack.kube, stack.namespace
    shape = shapes.load("dgx-h100")
    (node,) = sim_nodes.add_nodes(kube, ["dgx-h100:1"], start=95_100)
    sim_nodes.wait_ready(kube, [node])

    def devices() -> dict[str, dict[str, Any]]:
        return {
            d["name"]: d
            for s in kube.list(ResourceSlice)
            if s["spec"].get("nodeName") == node and s["spec"].get("driver") == "gpu.nvidia.com"
            for d in s["spec"].get("devices") or []
        }

    wait_for(
        "the node's 8 GPUs published", devices, until=lambda d: len(d) == 8, timeout=WAIT, context=stack.logs
    )
    hardware = mighw.MigHardware(Path(stack.sim.dir) / "hosts")
    entries = migparted.select(migparted.parse(default_mig_config()), "all-1g.10gb")
    hardware.set(node, shape, migparted.apply(entries, hardware.gpus(node, shape)))
    (plugin,) = [
        p
        for p in kube.list(Pod, namespace=ns, labels={"app": draplugin.PLUGIN_APP})
        if p.spec and p.spec.nodeName == node
    ]
    kube.delete(Pod, str(plugin.metadata.name if plugin.metadata else ""), namespace=ns, grace_period=0)
    migs = wait_for(
        "56 MIG devices published", devices, until=lambda d: len(d) == 56, timeout=WAIT, context=stack.logs
    )
    assert {d["attributes"]["type"]["string"] for d in migs.values()} == {"mig"}
    assert {d["attributes"]["profile"]["string"] for d in migs.values()} == {"1g.10gb"}

    workloads.claim_pod(kube, ns, "one-mig", 1, device_class="mig.nvidia.com")
    results = wait_for(
        "the MIG claim allocated", lambda: workloads.claim_results(kube, ns, "one-mig"), timeout=WAIT
    )
    assert [(r["driver"], r["pool"]) for r in results] == [("gpu.nvidia.com", node)]
    assert results[0]["device"] in migs

    # the plugin's DynamicMIG gate (not with NVMLDeviceHealthCheck): partitionable devices, the static
    # MIG devices destroyed by the new plugin pod; a claim for a MIG device gets a partition
    delete_pod(kube, ns, "one-mig")
    kube.patch(
        GPUClusterResource,
        "gpu-cluster",
        {"spec": {"draDriver": {"featureGates": {"NVMLDeviceHealthCheck": None, "DynamicMIG": True}}}},
        patch_type=PatchType.MERGE,
    )

    def specs() -> list[dict[str, Any]]:
        return sorted(
            (
                s["spec"]
                for s in kube.list(ResourceSlice)
                if s["spec"].get("nodeName") == node and s["spec"].get("driver") == "gpu.nvidia.com"
            ),
            key=lambda spec: "devices" in spec,
        )

    split = wait_for(
        "the node's pool split into counters and 8 GPUs",
        specs,
        until=lambda s: len(s) == 9,
        timeout=WAIT,
        context=stack.logs,
    )
    assert [c["name"] for c in split[0]["sharedCounters"]] == [f"gpu-{i}-counter-set" for i in range(8)]
    partitions = {d["name"]: d for spec in split[1:] for d in spec["devices"]}
    assert len(partitions) == 8 * 29 and all(d.get("consumesCounters") for d in partitions.values())
    assert not any(g.enabled for g in hardware.gpus(node, shape))
    workloads.claim_pod(kube, ns, "one-partition", 1, device_class="mig.nvidia.com")
    results = wait_for(
        "the partition claim allocated",
        lambda: workloads.claim_results(kube, ns, "one-partition"),
        timeout=WAIT,
    )
    assert (
        results[0]["pool"] == node
        and partitions[results[0]["device"]]["attributes"]["type"]["string"] == "mig"
    )


async def _round_trip(kubeconfig: str) -> tuple[str | None, list[str], list[str]]:
    """The version discovery picks, then a rule created, listed and deleted through it."""
    api = Kube(kubeconfig)
    try:
        version = await devicetaints.rule_version(api)
        assert version is not None
        body = health_dra.rule("node-a", "gpu-0", "unhealthy", None, version)
        assert await devicetaints.create_rule(api, version, body)
        listed = [
            r["metadata"]["name"] for r in await devicetaints.list_rules(api, version, MANAGED_SELECTOR)
        ]
        deleted = await health_dra.delete_rules(api)
        return version, listed, deleted
    finally:
        await api.close()


def test_discovery_takes_the_ga_version_and_the_beta_one_where_only_that_is_served(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Kubernetes' defaults serve v1 (1.37); with v1 off and v1beta2 on (as 1.36 serves it when
    enabled) the same calls take v1beta2; the rule round-trips either way."""
    found = binaries.locate(build=True).of("current")
    name = "gpu-health-node-a-gpu-0"
    for runtime_config, expected in (
        ((), "v1"),
        (("resource.k8s.io/v1/devicetaintrules=false", "resource.k8s.io/v1beta2=true"), "v1beta2"),
    ):
        plane = ControlPlane(
            tmp_path_factory.mktemp(f"dtr-{expected}") / "plane", found, runtime_config=runtime_config
        ).start()
        try:
            version, listed, deleted = asyncio.run(_round_trip(str(plane.admin_kubeconfig)))
            assert (version, listed, deleted) == (expected, [name], [name])
        finally:
            plane.stop()
