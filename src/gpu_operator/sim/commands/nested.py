"""`sim demo --nested`: seed 001's chain on two simulators, a host cluster and the cluster inside a VM.

1. Host cluster (<dir>/host): one seed-001 node (shape vfio-passthrough, its host tree at seed
   001's PCI addresses: 8x H100 SXM5 on vfio-pci), our chart installed with the platform package's
   host variant (`default`: values.yaml + values-passthrough.yaml), KubeVirt's CRD and CR, which the
   operator keeps in step (10DE:2330 -> nvidia.com/H100_SXM5_80GB), virt-handler's DaemonSet.
   virt-handler's device plugin (sim/standins/virthandler.py) publishes the GPUs on vfio-pci.
2. A VM that takes `gpus` of them: its virt-launcher pod asks for the tenant's resource name; the
   kubelet's allocation picks the devices (its checkpoint in the node's host tree).
3. Guest cluster (<dir>/guest): a second control plane whose one kwok node is that VM: its host tree
   a KubeVirt guest's (sim/hardware/guesttree.py) with exactly those GPUs, at the guest's PCI addresses; our
   chart installed with the package's `guest` variant; the ClusterPolicy becomes ready and the
   node shows `nvidia.com/gpu: <gpus>`.

kwok runs nothing in pods, so in each cluster the chart's operator pod is idle and the operator
process it would run (`gpu-operator run --leader-elect`, the chart's ServiceAccount's token) runs
here instead; the CRDs the chart's hook Job would apply are applied first, as in `sim up --helm`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_operator.sim.commands import session
from gpu_operator.sim.commands.nestedhost import (
    KUBEVIRT_NAMESPACE,
    NameMismatch,
    NestedError,
    deep_merge,
    kubevirt_api,
    node_resources,
    package_values,
    permitted_name,
    virt_handler,
    vm_pod,
    wait,
)
from gpu_operator.sim.commands.state import Proc, SimState

if TYPE_CHECKING:
    from gpu_operator.sim.plane.helm import Progress

HOST_SHAPE = "vfio-passthrough"
HOST_NODE = f"{HOST_SHAPE}-0"
SEED_001 = ["0a", "18", "3b", "44", "87", "90", "b8", "c1"]  # its GPUs' PCI buses
H100_SXM5 = "10de:2330"
SEED_001_RESOURCE = "nvidia.com/H100_SXM5_80GB"
NAMESPACE = RELEASE = "gpu-operator"
TENANT_NAMESPACE = "tenant-workload"  # seed 001's tenant Kubernetes: tenant-workload/main
VM_NAME = "kubernetes-main-md0-0"
GPU = "nvidia.com/gpu"
POLICY = "cluster-policy"  # the chart's ClusterPolicy
# Values the simulator needs on top of the package's: kwok nodes carry NFD's labels already (the
# chart's NFD-compatible discovery adds nothing here).
SIM_VALUES: dict[str, Any] = {"nfd": {"enabled": False}}


@dataclass
class Chain:
    """What the demo saw, for its summary and the test."""

    marks: list[tuple[str, float]] = field(default_factory=list)
    host_resource: str = ""
    host_capacity: dict[str, str] = field(default_factory=dict)
    host_allocatable: dict[str, str] = field(default_factory=dict)
    vm_pod: str = ""
    groups: list[str] = field(default_factory=list)
    host_addresses: list[str] = field(default_factory=list)
    guest_node: str = ""
    guest_addresses: list[str] = field(default_factory=list)
    guest_allocatable: dict[str, str] = field(default_factory=dict)
    policy: str = ""  # the guest's ClusterPolicy's status.state
    operands: list[str] = field(default_factory=list)  # the guest's DaemonSets running on the VM's node
    host: SimState | None = None
    guest: SimState | None = None
    _last: float = field(default_factory=time.monotonic)

    def mark(self, what: str) -> None:
        now = time.monotonic()
        self.marks.append((what, now - self._last))
        self._last = now


def seed_001_spec() -> dict[str, Any]:
    """The shape's host tree with its GPUs at seed 001's addresses (0a, 18, 3b, ... c1:00.0)."""
    from gpu_operator.sim.hardware.faults import node_host_spec

    spec = node_host_spec(HOST_SHAPE)
    for device, bus in zip(spec["devices"], SEED_001, strict=True):
        device["address"] = f"0000:{bus}:00.0"
    return spec


def install_chart(state: SimState, variant: str, progress: Progress) -> None:
    """Our chart with the package's `variant`, then the operator process its pod would run."""
    import helm_python

    from gpu_operator.kube.crds import apply_crds
    from gpu_operator.sim.plane.helm import packaged_chart
    from gpu_operator.sim.plane.operator_process import OperatorProcess

    client = session.admin_client(state)
    try:
        apply_crds(client)  # the chart's CRD hook Job's work (kwok runs nothing in it)
    finally:
        client.close()
    values = deep_merge(package_values(variant), SIM_VALUES)
    helm = helm_python.Config(kubeconfig_path=state.kubeconfig, namespace=NAMESPACE)
    with helm_python.Chart.load(packaged_chart(Path(state.dir) / "chart")) as chart:
        helm.install(chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True, timeout=120)
    progress(f"helm install {RELEASE} (namespace {NAMESPACE}) with the platform package's {variant!r} values")
    kubeconfig = session.attach(state).serviceaccount_kubeconfig(NAMESPACE, "gpu-operator", create=False)
    log = Path(state.dir) / "logs" / "operator.log"
    operator = OperatorProcess(kubeconfig=kubeconfig, namespace=NAMESPACE, log=log, leader_elect=True).start()
    assert operator.process is not None
    proc = Proc.of("operator", operator.process.pid, log)
    state.add(proc)
    state.save()
    session.wait_operator_ready(operator.health_port, proc)
    progress(f"the operator runs as the chart's ServiceAccount (pid {proc.pid}, log {log})")


def policy_status(state: SimState) -> dict[str, Any]:
    """The ClusterPolicy's status ({} before the operator wrote one, or without a policy)."""
    from lightkube.core.exceptions import ApiError

    from gpu_operator.kube.client import ClusterPolicyResource

    client = session.admin_client(state)
    try:
        return dict(dict(client.get(ClusterPolicyResource, POLICY)).get("status") or {})
    except ApiError as err:
        if err.status.code == 404:
            return {}
        raise
    finally:
        client.close()


def operands_on(state: SimState, node: str) -> list[str]:
    """The operator's DaemonSets with a Running pod on `node`."""
    from lightkube.resources.core_v1 import Pod

    client = session.admin_client(state)
    try:
        pods = client.list(Pod, namespace=NAMESPACE, fields={"spec.nodeName": node})
        return sorted(
            {
                ref.name
                for p in pods
                if p.status and p.status.phase == "Running"
                for ref in (p.metadata.ownerReferences if p.metadata else None) or []
                if ref.kind == "DaemonSet"
            }
        )
    finally:
        client.close()


def host_cluster(
    directory: Path, chain: Chain, gpus: int, tenant_resource: str, progress: Progress, timeout: float
) -> None:
    from gpu_operator.sim.hardware.faults import NodeHosts

    progress("== host cluster: seed 001's node, 8x H100 SXM5 on vfio-pci ==")
    state, _ = session.up(directory / "host", [f"{HOST_SHAPE}:1"], progress)
    chain.host = state
    NodeHosts(Path(state.dir) / "hosts").faults(HOST_NODE, seed_001_spec())  # the node's own tree
    client = session.admin_client(state)
    try:
        kubevirt_api(client, progress)
        chain.mark("host: control plane, node, KubeVirt's API")
        install_chart(state, "passthrough", progress)
        virt_handler(client, progress)
        name = wait(
            "the operator to list 10DE:2330 in KubeVirt's permittedHostDevices",
            lambda: permitted_name(client, H100_SXM5),
            progress,
            timeout,
        )
        progress(
            f"KubeVirt CR {KUBEVIRT_NAMESPACE}/kubevirt permits 10DE:2330 as {name} "
            "(externalResourceProvider: false: virt-handler's own device plugin)"
        )
        chain.host_resource = name

        def published() -> bool:
            capacity, allocatable = node_resources(client, HOST_NODE)
            chain.host_capacity, chain.host_allocatable = capacity, allocatable
            return int(allocatable.get(name, "0") or 0) > 0

        wait(
            f"virt-handler to publish {name} on {HOST_NODE}",
            published,
            progress,
            timeout,
            lambda: f"allocatable {name}={chain.host_allocatable.get(name, 'none')}",
        )
        progress(
            f"{HOST_NODE}: capacity {name}={chain.host_capacity[name]}, "
            f"allocatable {name}={chain.host_allocatable[name]}"
        )
        chain.mark("host: chart, operator, KubeVirt in step, virt-handler publishes")
        check_names(tenant_resource, name, chain.host_capacity)
        pod = vm_pod(client, TENANT_NAMESPACE, VM_NAME, tenant_resource, gpus)
        assert pod.metadata is not None
        chain.vm_pod = f"{TENANT_NAMESPACE}/{pod.metadata.name}"
        progress(f"VM {VM_NAME}: pod {chain.vm_pod} asks for {tenant_resource}: {gpus}")
        uid = str(pod.metadata.uid)
        entry = wait(
            f"the kubelet to give {chain.vm_pod} {gpus} device(s)",
            lambda: allocation(state, uid, tenant_resource),
            progress,
            timeout,
        )
        chain.groups = entry
        root = NodeHosts(Path(state.dir) / "hosts").root(HOST_NODE)
        from gpu_operator.sim.standins.virthandler import group_addresses

        chain.host_addresses = [a for g in entry for a in group_addresses(root, g)]
        progress(
            f"the kubelet gave it IOMMU group(s) {', '.join(entry)}: {', '.join(chain.host_addresses)} "
            "(virt-handler's Allocate hands these addresses to virt-launcher)"
        )
        chain.mark("host: the VM's pod gets its GPUs")
    finally:
        client.close()


def check_names(tenant: str, published: str, capacity: dict[str, str]) -> None:
    """The name the tenant's VM asks for must be one the host's node publishes."""
    if tenant != published or tenant not in capacity:
        raise NameMismatch(
            f"the tenant's VM asks for {tenant!r} but the host publishes {published!r} "
            f"(KubeVirt CR {KUBEVIRT_NAMESPACE}/kubevirt, permittedHostDevices; node {HOST_NODE}): "
            f"the VM's pod would stay Pending. Fix: ask for {published!r} in the tenant's gpus, or "
            f"give the KubeVirt entry that resourceName",
            tenant,
            published,
        )


def allocation(state: SimState, uid: str, resource: str) -> list[str] | None:
    from gpu_operator.sim.hardware.faults import NodeHosts
    from gpu_operator.sim.standins.virthandler import read_checkpoint

    for entry in read_checkpoint(NodeHosts(Path(state.dir) / "hosts").root(HOST_NODE)):
        if entry.get("PodUID") == uid and entry.get("ResourceName") == resource:
            return [i for ids in (entry.get("DeviceIDs") or {}).values() for i in ids]
    return None


def guest_cluster(directory: Path, chain: Chain, shape: str, progress: Progress, timeout: float) -> None:
    from gpu_operator import shapes
    from gpu_operator.sim.hardware import guesttree
    from gpu_operator.sim.hardware.faults import NodeHosts
    from gpu_operator.sim.plane import nodes

    gpus = len(chain.host_addresses)
    progress(f"== guest cluster: the VM {VM_NAME} as its one node, {gpus} GPU(s) passed through ==")
    state, _ = session.up(directory / "guest", [], progress)
    chain.guest = state
    spec = guesttree.guest_spec(gpus=gpus)
    NodeHosts(Path(state.dir) / "hosts").faults(VM_NAME, spec)  # the VM's tree, before the node joins
    chain.guest_node = VM_NAME
    chain.guest_addresses = [d["address"] for d in spec["devices"] if d["vendor"] == "10de"]
    client = session.admin_client(state)
    try:
        nodes.create_node(client, shapes.load(shape).node(VM_NAME))
        nodes.wait_ready(client, [VM_NAME])
        progress(
            f"node {VM_NAME} (shape {shape}) Ready; its GPUs at guest addresses {', '.join(chain.guest_addresses)}"
        )
        chain.mark("guest: control plane and the VM's node")
        install_chart(state, "guest", progress)

        def ready() -> bool:
            chain.guest_allocatable = node_resources(client, VM_NAME)[1]
            status = policy_status(state)
            chain.policy = f"{status.get('state') or 'not reconciled yet'}"
            return status.get("state") == "ready" and chain.guest_allocatable.get(GPU) == str(gpus)

        wait(
            f"the guest's ClusterPolicy ready and {GPU}: {gpus} on {VM_NAME}",
            ready,
            progress,
            timeout,
            lambda: (
                f"ClusterPolicy {chain.policy}; allocatable {GPU}={chain.guest_allocatable.get(GPU, 'none')}"
            ),
        )
        chain.operands = operands_on(state, VM_NAME)
        progress(
            f"guest: ClusterPolicy {POLICY} {chain.policy}; {VM_NAME} allocatable {GPU}={chain.guest_allocatable[GPU]}"
        )
        chain.mark("guest: chart, operator, ClusterPolicy ready")
    finally:
        client.close()


def guest_shape(gpus: int, vendor_device: str = H100_SXM5) -> str:
    """The node shape of a KubeVirt guest (NFD's hypervisor label) with `gpus` GPUs of that ID."""
    from gpu_operator import shapes
    from gpu_operator.vocabulary import NFD

    guests = [shapes.load(n) for n in shapes.names()]
    guests = [s for s in guests if s.extra_labels.get(f"{NFD}/cpu-cpuid.HYPERVISOR") == "true"]
    for shape in guests:
        if shape.gpu_count == gpus and shape.gpu_vendor_device.lower() == vendor_device:
            return shape.name
    have = ", ".join(f"{s.name} ({s.gpu_count}x {s.gpu_vendor_device})" for s in guests) or "none"
    raise NestedError(
        f"--gpus {gpus}: no VM guest node shape with {gpus} GPU(s) of {vendor_device} "
        f"(guest shapes: {have}); give --gpus to match one"
    )


def run(
    directory: Path,
    progress: Progress,
    gpus: int = 2,
    tenant_resource: str = SEED_001_RESOURCE,
    keep: bool = False,
    timeout: float = 120.0,
) -> Chain:
    """The whole chain; raises NestedError naming the step that failed. Both simulators are torn
    down afterwards unless `keep`."""
    if not 1 <= gpus <= len(SEED_001):
        raise NestedError(f"--gpus {gpus}: the host has {len(SEED_001)} GPUs; give 1 to {len(SEED_001)}")
    directory = Path(directory)
    shape = guest_shape(gpus)  # before anything starts
    chain = Chain()
    try:
        host_cluster(directory, chain, gpus, tenant_resource, progress, timeout)
        guest_cluster(directory, chain, shape, progress, timeout)
        return chain
    finally:
        if not keep:
            for part in ("guest", "host"):
                session.down(directory / part, progress)


def report(chain: Chain) -> list[str]:
    """The chain as it was seen, one fact a line."""
    name = chain.host_resource
    lines = [
        f"host   {HOST_NODE}: capacity {name}={chain.host_capacity.get(name)}, "
        f"allocatable {name}={chain.host_allocatable.get(name)} (virt-handler's device plugin)",
        f"VM     {chain.vm_pod}: {name} x{len(chain.groups)} -> IOMMU group(s) {', '.join(chain.groups)} "
        f"= host {', '.join(chain.host_addresses)}",
        f"guest  {chain.guest_node}: GPUs at {', '.join(chain.guest_addresses)} (behind QEMU root ports)",
        f"guest  ClusterPolicy {POLICY}: {chain.policy}; {chain.guest_node} allocatable {GPU}="
        f"{chain.guest_allocatable.get(GPU)}",
        f"guest  running on {chain.guest_node}: {', '.join(chain.operands)}",
    ]
    lines += [f"time   {what}: {seconds:.1f}s" for what, seconds in chain.marks]
    lines.append(f"time   total: {sum(s for _, s in chain.marks):.1f}s")
    return lines


def demo(directory: Path, gpus: int, tenant_resource: str, keep: bool, timeout: float) -> int:
    """`sim demo --nested`: the chain with progress lines, then what it saw; 0 when the guest's
    ClusterPolicy became ready with the VM's GPUs on its node, 1 otherwise (the failed step named)."""
    import typer

    def progress(msg: str) -> None:
        typer.echo(f"sim: {msg}", err=True)

    try:
        chain = run(
            directory, progress, gpus=gpus, tenant_resource=tenant_resource, keep=keep, timeout=timeout
        )
    except (NestedError, session.SimError) as err:
        typer.secho(f"error: {err}", fg="red", err=True)
        return 1
    for line in report(chain):
        typer.echo(line)
    if keep and chain.host and chain.guest:
        typer.echo(
            f"Both clusters keep running: host KUBECONFIG={chain.host.kubeconfig}, "
            f"guest KUBECONFIG={chain.guest.kubeconfig}; stop them with gpu-operator sim down --dir "
            f"{directory / 'host'} and --dir {directory / 'guest'}"
        )
    return 0
