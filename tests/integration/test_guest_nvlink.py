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

from gpu_operator.render.guestnvlink import CONFIGMAP, DAEMONSET_SUFFIX
from gpu_operator.sim.operator_process import OperatorProcess
from tests.support.status import reconciled
from tests.support.waiting import wait_for

MAIN = "nvidia-driver-daemonset"
USER = {"nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\n", "nvidia-uvm.conf": "uvm_perf_prefetch_enable=0\n"}


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

    def driver_pods() -> dict[str, str]:
        pods = kube.list(
            Pod, namespace=operator_namespace, labels={"app.kubernetes.io/component": "nvidia-driver"}
        )
        return {
            str(p.spec.nodeName): str(owner.name)
            for p in pods
            if p.spec and p.spec.nodeName and p.metadata
            for owner in (p.metadata.ownerReferences or [])[:1]
        }

    want = {bare: MAIN, guest: MAIN + DAEMONSET_SUFFIX}
    wait_for(
        "NVIDIA's driver pod on bare metal, ours on the guest",
        driver_pods,
        until=lambda got: got == want,
        context=operator.log_text,
    )
    ours = kube.get(ConfigMap, CONFIGMAP, namespace=operator_namespace)
    assert ours.data == {**USER, "nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\nNVreg_NvLinkDisable=1\n"}
    user = kube.get(ConfigMap, "kmods", namespace=operator_namespace)
    assert user.data == USER and user.metadata.resourceVersion == before
    main = kube.get(DaemonSet, MAIN, namespace=operator_namespace)
    assert main.status is not None and main.status.desiredNumberScheduled == 1
