"""The KubeVirt sync on the real control plane: KubeVirt's CRD (tests/fixtures/kubevirt, the fields we
touch, as KubeVirt's API declares them: pciHostDevices an atomic list) served by the apiserver, the
operator process applying the list with server-side apply under its own field manager, kwok nodes
carrying the probe's published facts, the ClusterPolicy's VMPassthrough condition and Node Events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import (
    HOST_DEVICE_LISTED_BY_OTHERS,
    HOST_DRIVER_ON_PASSTHROUGH_REASON,
    KUBEVIRT_DEVICES_ANNOTATION,
    KUBEVIRT_FIELD_MANAGER,
    PASSTHROUGH_DEVICES_ANNOTATION,
    PROBE_FACTS_ANNOTATION,
    WORKLOAD_CONFIG,
)
from tests.support.kubevirt import (
    OURS_KUBEVIRT,
    OURS_SANDBOX,
    PASSTHROUGH,
    SEED_001,
    USER_ENTRY,
    KubeVirt,
    annotate,
    apply_crd,
    delete_crd,
    devices,
    kubevirt_body,
    kubevirt_dict,
    probe_facts,
    vm_condition,
)
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]


@pytest.fixture(scope="module")
def kubevirt_crd(kube: Client) -> Iterator[None]:
    apply_crd(kube)
    yield
    delete_crd(kube)


@pytest.fixture
def kubevirt_cr(kube: Client, kubevirt_crd: None, namespace: str) -> Callable[..., str]:
    """The cluster's KubeVirt CR, created by its user with their own entries (their field manager)."""
    for old in kube.list(KubeVirt, namespace="*"):  # one KubeVirt per cluster: none left by a test before
        kube.delete(KubeVirt, str(old.metadata.name), namespace=old.metadata.namespace)
    wait_for(
        "no KubeVirt CR left", lambda: list(kube.list(KubeVirt, namespace="*")), until=lambda crs: not crs
    )

    def create(entries: list[dict[str, Any]]) -> str:
        kube.apply(KubeVirt.from_dict(kubevirt_body(namespace, entries)), field_manager="platform-admin")
        return namespace

    return create


@pytest.fixture(autouse=True)
def _other_nodes_are_container_nodes(kube: Client) -> Iterator[None]:
    """The nodes already on the shared control plane before a test makes its own (the real kubelet
    node, with its GPU) get the container workload for the test: with spec.sandboxWorkloads'
    defaultWorkload vm-passthrough they would be passthrough nodes without probe facts, and keep
    VMPassthrough False (ProbeFactsMissing), which is right on a cluster but not this test's subject."""
    others = [
        n.metadata.name
        for n in kube.list(Node)
        if n.metadata and n.metadata.name and WORKLOAD_CONFIG not in (n.metadata.labels or {})
    ]
    for name in others:
        kube.patch(
            Node, name, {"metadata": {"labels": {WORKLOAD_CONFIG: "container"}}}, patch_type=PatchType.MERGE
        )
    yield
    for name in others:
        try:
            kube.patch(
                Node, name, {"metadata": {"labels": {WORKLOAD_CONFIG: None}}}, patch_type=PatchType.MERGE
            )
        except ApiError as err:
            if err.status.code != 404:
                raise


def test_two_passthrough_nodes_list_the_h100_once_and_the_users_entry_survives(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    kubevirt_cr: Callable[..., str],
) -> None:
    names = fake_nodes("vfio-passthrough:2")
    for name in names:
        annotate(kube, name, {PROBE_FACTS_ANNOTATION: probe_facts({b: "vfio-pci" for b in SEED_001})})
    ns = kubevirt_cr([USER_ENTRY])
    operator = start_operator()
    cluster_policies(PASSTHROUGH)

    wait_for(
        "KubeVirt lists the user's entry, then 10DE:2330 once (KubeVirt's own plugin)",
        lambda: devices(kube, ns),
        until=lambda d: d == [USER_ENTRY, OURS_KUBEVIRT],
        context=operator.log_text,
    )
    cr = kubevirt_dict(kube, ns)
    assert cr["metadata"]["annotations"][KUBEVIRT_DEVICES_ANNOTATION] == "10DE:2330"
    managers = {m["manager"]: m["operation"] for m in cr["metadata"]["managedFields"]}
    assert managers.get(KUBEVIRT_FIELD_MANAGER) == "Apply"
    # what we did not write stays the user's: the feature gate list keeps its manager
    assert cr["spec"]["configuration"]["developerConfiguration"]["featureGates"] == ["HostDevices"]
    cond = wait_for(
        "VMPassthrough condition synced",
        lambda: vm_condition(kube),
        until=lambda c: c.get("reason") == "HostDevicesSynced",
        context=operator.log_text,
    )
    assert cond["status"] == "True"
    assert "10DE:2330 nvidia.com/H100_SXM5_80GB: 16 GPU(s) on vfio-pci on 2 node(s)" in cond["message"]

    # Our sandbox device plugin on: it advertises the GPUs, KubeVirt must leave them to it.
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"sandboxDevicePlugin": {"enabled": True}}},
        patch_type=PatchType.MERGE,
    )
    wait_for(
        "externalResourceProvider flipped, named as NVIDIA's sandbox plugin names it",
        lambda: devices(kube, ns),
        until=lambda d: d == [USER_ENTRY, OURS_SANDBOX],
        context=operator.log_text,
    )

    # The user adds an entry of their own later (a client-side edit of the list): kept on the next sync.
    later = {"pciVendorSelector": "10DE:1EB8", "resourceName": "nvidia.com/TU104GL_Tesla_T4"}
    kube.patch(
        KubeVirt,
        "kubevirt",
        {
            "spec": {
                "configuration": {
                    "permittedHostDevices": {"pciHostDevices": [USER_ENTRY, OURS_SANDBOX, later]}
                }
            }
        },
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"sandboxDevicePlugin": {"enabled": False}}},
        patch_type=PatchType.MERGE,
    )
    wait_for(
        "our entry back to KubeVirt's plugin, both user entries kept",
        lambda: devices(kube, ns),
        until=lambda d: d == [USER_ENTRY, later, OURS_KUBEVIRT],
        context=operator.log_text,
    )


def test_host_driver_on_passthrough_is_a_warning_in_status_and_an_event(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    kubevirt_cr: Callable[..., str],
) -> None:
    (node,) = fake_nodes("vfio-passthrough:1")
    annotate(
        kube,
        node,
        {PROBE_FACTS_ANNOTATION: probe_facts({b: ("nvidia" if b == "0a" else "vfio-pci") for b in SEED_001})},
    )
    ns = kubevirt_cr([])
    operator = start_operator()
    cluster_policies(PASSTHROUGH)

    cond = wait_for(
        "VMPassthrough names the host driver",
        lambda: vm_condition(kube),
        until=lambda c: c.get("reason") == HOST_DRIVER_ON_PASSTHROUGH_REASON,
        context=operator.log_text,
    )
    assert cond["status"] == "False" and "0000:0a:00.0" in cond["message"] and node in cond["message"]
    events = wait_for(
        "a Warning Event on the Node",
        lambda: [
            e
            for e in kube.list(Event, namespace="default", fields={"involvedObject.name": node})
            if e.reason == HOST_DRIVER_ON_PASSTHROUGH_REASON
        ],
        until=bool,
        context=operator.log_text,
    )
    assert events[0].type == "Warning" and "vfio-manage bind --device 0000:0a:00.0" in (
        events[0].message or ""
    )
    # the seven GPUs on vfio-pci are still listed
    wait_for("10DE:2330 listed", lambda: devices(kube, ns), until=lambda d: d == [OURS_KUBEVIRT])
    assert len(events) == 1  # one Event per finding, not one per pass


def test_mixed_node_4_plus_4_both_stacks_and_only_the_bound_half_counted(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    kubevirt_cr: Callable[..., str],
    operator_namespace: str,
) -> None:
    (node,) = fake_nodes("vfio-passthrough:1")
    vms, containers = SEED_001[:4], SEED_001[4:]
    annotate(
        kube,
        node,
        {
            PASSTHROUGH_DEVICES_ANNOTATION: ",".join(f"0000:{b}:00.0" for b in vms),
            PROBE_FACTS_ANNOTATION: probe_facts(
                {**{b: "vfio-pci" for b in vms}, **{b: "nvidia" for b in containers}}
            ),
        },
    )
    ns = kubevirt_cr([])
    operator = start_operator()
    cluster_policies(PASSTHROUGH)

    def labels() -> dict[str, str]:
        return dict(kube.get(Node, node).metadata.labels or {})

    wanted = (
        "vfio-manager",
        "sandbox-validator",
        "sandbox-device-plugin",
        "device-plugin",
        "container-toolkit",
        "operator-validator",
        "driver",
    )
    wait_for(
        "both stacks' deploy labels",
        labels,
        until=lambda lb: all(lb.get(f"nvidia.com/gpu.deploy.{c}") == "true" for c in wanted),
        context=operator.log_text,
    )
    cond = wait_for(
        "VMPassthrough counts the 4 bound GPUs",
        lambda: vm_condition(kube),
        until=lambda c: c.get("reason") == "HostDevicesSynced",
        context=operator.log_text,
    )
    assert "4 GPU(s) on vfio-pci on 1 node(s)" in cond["message"]
    assert devices(kube, ns) == [OURS_KUBEVIRT]
    # The vfio manager and the probe run our commands from our image, each as its own ServiceAccount.
    for name, command in (
        ("nvidia-vfio-manager", ["gpu-operator", "node", "vfio-manage", "reconcile"]),
        (
            "nvidia-gpu-probe",
            [
                "gpu-operator",
                "node",
                "probe",
                "--publish",
                "--interval=60",
                "--default-workload=vm-passthrough",
            ],
        ),
    ):
        ds = wait_for(
            f"DaemonSet {name} ready on the node",
            lambda n=name: next(  # type: ignore[misc]
                (d for d in kube.list(DaemonSet, namespace=operator_namespace) if d.metadata.name == n), None
            ),
            until=lambda d: d is not None and (d.status.numberReady or 0) == 1,
            context=operator.log_text,
        )
        pod = ds.spec.template.spec
        assert pod.containers[0].command == command and pod.serviceAccountName == name
        assert pod.containers[0].image.startswith("ghcr.io/gpu-operator-py/gpu-operator")
        assert not pod.initContainers

    # A device the KubeVirt CR already lists for another plugin: reported, not fought over.
    kube.patch(
        KubeVirt,
        "kubevirt",
        {
            "metadata": {"annotations": {KUBEVIRT_DEVICES_ANNOTATION: None}},
            "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": [OURS_SANDBOX]}}},
        },
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"metadata": {"annotations": {"touch": "1"}}},
        patch_type=PatchType.MERGE,
    )
    cond = wait_for(
        "VMPassthrough reports the entry someone else owns",
        lambda: vm_condition(kube),
        until=lambda c: c.get("reason") == HOST_DEVICE_LISTED_BY_OTHERS,
        context=operator.log_text,
    )
    assert cond["status"] == "False" and "10DE:2330" in cond["message"]
    assert devices(kube, ns) == [OURS_SANDBOX]
    wait_for(
        "a Warning Event about the ClusterPolicy",
        lambda: [
            e
            for e in kube.list(Event, namespace="default", fields={"involvedObject.name": "cluster-policy"})
            if e.reason == HOST_DEVICE_LISTED_BY_OTHERS
        ],
        until=bool,
    )


def test_kwok_passthrough_nodes_need_no_hand_annotation_the_simulated_agents_publish_their_facts(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    kubevirt_cr: Callable[..., str],
    tmp_path: Path,
) -> None:
    """What `sim up --shape vfio-passthrough:2 --operator` does: the operator's probe and vfio
    manager DaemonSets run their pods on the kwok nodes, the simulator plays the two agents there
    (sim/standins/probestandin.py, only where their pods run), and the KubeVirt CR lists their GPUs."""
    from lightkube import KubeConfig

    from gpu_operator import shapes
    from gpu_operator.sim.standins import roster
    from gpu_operator.vocabulary import VFIO_STATE

    spec = "vfio-passthrough:2"
    names = fake_nodes(spec)
    ns = kubevirt_cr([])
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    with roster.running(config, nodes=False, hosts=tmp_path / "hosts", agents=True) as agents:
        operator = start_operator()
        cluster_policies(PASSTHROUGH)
        wait_for(
            "the vfio manager's outcome on both nodes (its pods ran there)",
            lambda: {(kube.get(Node, n).metadata.labels or {}).get(VFIO_STATE) for n in names},
            until=lambda states: states == {"bound"},
            timeout=120,
            context=operator.log_text,
        )
        selector = shapes.parse_spec(spec)[0].gpu_vendor_device.upper()
        listed = wait_for(
            f"KubeVirt lists {selector} from the published facts",
            lambda: devices(kube, ns),
            until=lambda d: [e["pciVendorSelector"] for e in d] == [selector],
            context=operator.log_text,
        )
    assert agents.error is None, agents.error
    assert listed[0]["externalResourceProvider"] is False and listed[0]["resourceName"].startswith(
        "nvidia.com/"
    )


def test_with_the_vfio_manager_off_the_probe_still_runs_and_unseen_gpus_are_not_synced(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    kubevirt_cr: Callable[..., str],
    tmp_path: Path,
) -> None:
    """GPUs bound to vfio-pci at boot, so no vfio manager (vfioManager off): the operator still runs
    the GPU probe on the passthrough nodes, since the KubeVirt sync needs its facts. Until they come
    the VMPassthrough condition is False (ProbeFactsMissing) and names the nodes, not True with an
    empty list; once the probe's pods publish, KubeVirt lists the GPUs and the condition is True."""
    from lightkube import KubeConfig

    from gpu_operator import shapes
    from gpu_operator.render.states.vfio_manager import NAME as VFIO_DS
    from gpu_operator.render.states.vfio_manager import PROBE as PROBE_DS
    from gpu_operator.sim.standins import roster
    from gpu_operator.vocabulary import PROBE_FACTS_MISSING

    spec = "vfio-passthrough:2"
    names = fake_nodes(spec)
    ns = kubevirt_cr([])
    operator = start_operator()
    cluster_policies({**PASSTHROUGH, "vfioManager": {"enabled": False}})
    # no stand-in plays the probe yet: its facts are missing, and the condition says whose
    cond = wait_for(
        "VMPassthrough says which nodes' GPUs it cannot see",
        lambda: vm_condition(kube),
        until=lambda c: c.get("reason") == PROBE_FACTS_MISSING,
        context=operator.log_text,
    )
    assert cond["status"] == "False"
    assert all(name in cond["message"] for name in names), cond
    assert "app=nvidia-gpu-probe" in cond["message"], cond  # the fix: where to look
    daemonsets = wait_for(
        "the probe's DaemonSet without the vfio manager's",
        lambda: {
            str(d.metadata.name)
            for d in kube.list(DaemonSet, namespace="*")
            if d.metadata is not None and d.metadata.name in (VFIO_DS, PROBE_DS)
        },
        until=lambda found: PROBE_DS in found,
        context=operator.log_text,
    )
    assert daemonsets == {PROBE_DS}, daemonsets
    assert devices(kube, ns) == []
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    with roster.running(config, nodes=False, hosts=tmp_path / "hosts", agents=True) as agents:
        selector = shapes.parse_spec(spec)[0].gpu_vendor_device.upper()
        wait_for(
            f"KubeVirt lists {selector} from the probe's facts",
            lambda: devices(kube, ns),
            until=lambda d: [e["pciVendorSelector"] for e in d] == [selector],
            context=operator.log_text,
        )
        cond = wait_for(
            "VMPassthrough synced",
            lambda: vm_condition(kube),
            until=lambda c: c.get("reason") == "HostDevicesSynced",
            context=operator.log_text,
        )
    assert agents.error is None, agents.error
    assert cond["status"] == "True"
    assert "on 2 node(s)" in cond["message"], cond
    assert agents.identities is not None and not list(agents.identities.refusals.seen), list(
        agents.identities.refusals.seen
    )  # the rendered RBAC let the probe do its work
