"""The operator (real process) on a bare-metal DGX H100 node and a KubeVirt guest node with two H100
SXM5 and no NVSwitch: the real DaemonSet controller puts NVIDIA's driver pod on the first and ours
(NVLink off, the user's kernel-module ConfigMap merged) on the guest; the user's ConfigMap is
never written. Real components: kube-apiserver, kube-controller-manager's DaemonSet controller,
kwok (pods), the operator."""

from __future__ import annotations

from collections.abc import Callable

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Pod

from gpu_operator.kube.client import NVIDIADriverResource
from gpu_operator.render.guestnvlink import CONFIGMAP, DAEMONSET_SUFFIX
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.status import condition, driver_status, reconciled
from tests.support.waiting import wait_for

MAIN = "nvidia-driver-daemonset"
USER = {"nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\n", "nvidia-uvm.conf": "uvm_perf_prefetch_enable=0\n"}


def driver_pods(kube: Client, namespace: str) -> dict[str, str]:
    """{node: the DaemonSet of its driver pod}"""
    pods = kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/component": "nvidia-driver"})
    return {
        str(p.spec.nodeName): str(owner.name)
        for p in pods
        if p.spec and p.spec.nodeName and p.metadata
        for owner in (p.metadata.ownerReferences or [])[:1]
    }


def test_guest_node_gets_nvlink_off_and_the_users_configmap_stays(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    bare = fake_nodes("dgx-h100:1")[0]
    guest = fake_nodes("kubevirt-guest-h100:1")[0]
    kube.create(ConfigMap(metadata=ObjectMeta(name="kmods", namespace=operator_namespace), data=dict(USER)))
    before = kube.get(ConfigMap, "kmods", namespace=operator_namespace).metadata.resourceVersion
    operator = start_operator()
    cluster_policies({"driver": {"kernelModuleConfig": {"name": "kmods"}}})
    reconciled(kube, context=operator.log_text)

    want = {bare: MAIN, guest: MAIN + DAEMONSET_SUFFIX}
    wait_for(
        "NVIDIA's driver pod on bare metal, ours on the guest",
        lambda: driver_pods(kube, operator_namespace),
        until=lambda got: got == want,
        context=operator.log_text,
    )
    ours = kube.get(ConfigMap, CONFIGMAP, namespace=operator_namespace)
    assert ours.data == {**USER, "nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\nNVreg_NvLinkDisable=1\n"}
    user = kube.get(ConfigMap, "kmods", namespace=operator_namespace)
    assert user.data == USER and user.metadata.resourceVersion == before
    main = kube.get(DaemonSet, MAIN, namespace=operator_namespace)
    assert main.status is not None and main.status.desiredNumberScheduled == 1


def test_nvidiadriver_pool_splits_its_guest_node_off(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    nvidia_drivers: Callable[..., str],
    operator_namespace: str,
) -> None:
    """The same nodes under an NVIDIADriver (one pool, ubuntu22.04): the pool's DaemonSet on bare
    metal, its guest-nvlink-off twin on the guest, reading the CR's kernelModuleConfig merged."""
    bare = fake_nodes("dgx-h100:1")[0]
    guest = fake_nodes("kubevirt-guest-h100:1")[0]
    kube.create(ConfigMap(metadata=ObjectMeta(name="kmods", namespace=operator_namespace), data=dict(USER)))
    before = kube.get(ConfigMap, "kmods", namespace=operator_namespace).metadata.resourceVersion
    operator = start_operator()
    cluster_policies({"driver": {"useNvidiaDriverCRD": True}})
    nvidia_drivers("pool-a", {"kernelModuleConfig": {"name": "kmods"}})

    def context() -> str:
        return f"{driver_status(kube, 'pool-a')}\n{operator.log_text()[-3000:]}"

    wait_for(
        "NVIDIADriver pool-a ready",
        lambda: condition(driver_status(kube, "pool-a"), "Ready").get("reason") == "Reconciled",
        timeout=120,
        context=context,
    )
    uid = kube.get(NVIDIADriverResource, "pool-a")["metadata"]["uid"]
    owned = sorted(
        str(ds.metadata.name)
        for ds in kube.list(DaemonSet, namespace=operator_namespace)
        if ds.metadata and any(ref.uid == uid for ref in ds.metadata.ownerReferences or [])
    )
    assert len(owned) == 2 and owned[1] == owned[0] + DAEMONSET_SUFFIX, owned
    assert driver_pods(kube, operator_namespace) == {bare: owned[0], guest: owned[1]}
    ours = kube.get(ConfigMap, f"nvidia-gpu-driver-pool-a{DAEMONSET_SUFFIX}", namespace=operator_namespace)
    assert ours.data == {**USER, "nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\nNVreg_NvLinkDisable=1\n"}
    user = kube.get(ConfigMap, "kmods", namespace=operator_namespace)
    assert user.data == USER and user.metadata.resourceVersion == before
