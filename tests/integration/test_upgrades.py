"""Driver upgrades on the real control plane: the DaemonSet controller's OnDelete flow replaces
driver pods on kwok nodes, the Eviction API enforces PodDisruptionBudgets, and the operator's
upgrade controller walks every node through the states."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType

from gpu_operator.controllers import status as st
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.controllers.units.upgrade.state import (
    ACTIVE,
    UPGRADE_DONE,
    UPGRADE_FAILED,
    UPGRADE_REQUIRED,
)
from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import (
    UPGRADE_FAILURE_REASON_ANNOTATION,
    UPGRADE_SKIP,
)
from tests.support import workloads
from tests.support.cleanup import delete_if_present
from tests.support.status import condition, policy_status, reconciled
from tests.support.upgrades import (
    StateRecorder,
    cli,
    driver_pods,
    standalone_dra_driver,
    states,
    upgrade_driver,
    upgrades_pending,
)
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]

POLICY = {
    "autoUpgrade": True,
    "maxParallelUpgrades": 5,
    "maxUnavailable": "100%",
    "gpuPodDeletion": {"timeoutSeconds": 4},
    "podDeletion": {"timeoutSeconds": 4},
    "drain": {"enable": True, "timeoutSeconds": 8},
}


@pytest.fixture
def upgrade_cluster(
    kube: Client, fake_nodes: Nodes, start_operator: Start, cluster_policies: Policies, namespace: str
) -> Iterator[Callable[..., tuple[list[str], OperatorProcess]]]:
    def setup(count: int, policy: dict[str, Any]) -> tuple[list[str], OperatorProcess]:
        names = fake_nodes(f"dgx-h100:{count}")
        operator = start_operator()
        cluster_policies({"driver": {"upgradePolicy": policy}})
        reconciled(kube, timeout=180, context=operator.log_text)
        wait_for(
            "every node upgrade-done (initial state)",
            lambda: set(states(kube, names).values()) == {UPGRADE_DONE},
            timeout=60,
            context=operator.log_text,
        )
        return names, operator

    yield setup


def test_rolling_upgrade_bounded_parallel_pdb_skip_and_cordoned(
    kube: Client,
    upgrade_cluster: Callable[..., tuple[list[str], OperatorProcess]],
    namespace: str,
    operator_namespace: str,
    control_plane: ControlPlane,
) -> None:
    names, operator = upgrade_cluster(20, POLICY)
    blocked, skipped, cordoned = names[0], names[1], names[2]
    workloads.create(
        kube,
        workloads.gpu_deployment(
            "train",
            namespace,
            20,
            node_selector={
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            },
        ),
    )
    workloads.create(
        kube,
        workloads.gpu_deployment("serve", namespace, 1, node_selector={"kubernetes.io/hostname": blocked}),
        workloads.pdb("serve-pdb", namespace, "serve", 1),
    )
    wait_for(
        "workload pods running",
        lambda: (
            sum(1 for p in kube.list(Pod, namespace=namespace) if p.status and p.status.phase == "Running")
            == 21
        ),
        timeout=90,
    )
    kube.patch(Node, skipped, {"metadata": {"labels": {UPGRADE_SKIP: "true"}}})
    kube.patch(Node, cordoned, {"spec": {"unschedulable": True}})
    before = driver_pods(kube, operator_namespace)
    evicted_from = {str(p.metadata.name): str(p.spec.nodeName) for p in kube.list(Pod, namespace=namespace)}

    with StateRecorder(kube, names) as recorder:
        upgrade_driver(kube, "580.95.05")
        others = [n for n in names if n not in (blocked, skipped)]
        wait_for(
            "every other node upgrade-done, the PDB-blocked one failed",
            lambda: (
                all(s == UPGRADE_DONE for n, s in states(kube, names).items() if n in others)
                and states(kube, [blocked])[blocked] == UPGRADE_FAILED
            ),
            timeout=240,
            context=lambda: f"{states(kube, names)}\n{operator.log_text()[-3000:]}",
        )
    assert recorder.peak <= 5, recorder.history
    assert recorder.peak >= 2, recorder.history  # it did run in parallel
    assert states(kube, [skipped])[skipped] == UPGRADE_REQUIRED
    reason = (kube.get(Node, blocked).metadata.annotations or {})[UPGRADE_FAILURE_REASON_ANNOTATION]
    assert f"PodDisruptionBudget {namespace}/serve-pdb" in reason, reason
    for name in others:
        node = kube.get(Node, name)
        assert bool(node.spec.unschedulable) == (name == cordoned), name
    after = driver_pods(kube, operator_namespace)
    assert all(after[n] != before[n] for n in others)  # replaced with the new revision
    assert after[skipped] == before[skipped] and after[blocked] == before[blocked]
    # GPU workload pods on upgraded nodes were evicted and rescheduled
    running = [p for p in kube.list(Pod, namespace=namespace) if p.metadata.labels.get("app") == "train"]
    moved = [p for p in evicted_from if evicted_from[p] in others]
    assert moved and not any(str(p.metadata.name) in moved for p in running)
    wait_for(
        "train rescheduled",
        lambda: (
            sum(
                1
                for p in kube.list(Pod, namespace=namespace, labels={"app": "train"})
                if p.status and p.status.phase == "Running"
            )
            == 20
        ),
        timeout=60,
    )

    # the failure is shown by `upgrade status` and `status`, and `upgrade retry` unsticks the node
    shown = cli(control_plane, "upgrade", "status")
    assert shown.returncode == 1 and blocked in shown.stdout and "serve-pdb" in shown.stdout, shown
    overall = cli(control_plane, "status", "--max-nodes", "30")
    assert f"driver upgrade failed on {blocked}" in overall.stdout and "serve-pdb" in overall.stdout, (
        overall.stdout
    )
    kube.delete(PodDisruptionBudget, "serve-pdb", namespace=namespace)
    assert cli(control_plane, "upgrade", "retry", blocked).returncode == 0
    wait_for(
        "retried node upgrade-done and uncordoned",
        lambda: (
            states(kube, [blocked])[blocked] == UPGRADE_DONE
            and not kube.get(Node, blocked).spec.unschedulable
        ),
        timeout=60,
        context=lambda: str(states(kube, [blocked])),
    )
    assert cli(control_plane, "upgrade", "status").returncode == 0


def test_pause_then_sigkill_mid_upgrade_continues_without_double_upgrade_then_auto_upgrade_off(
    kube: Client,
    upgrade_cluster: Callable[..., tuple[list[str], OperatorProcess]],
    start_operator: Start,
    operator_namespace: str,
    control_plane: ControlPlane,
) -> None:
    names, operator = upgrade_cluster(6, {**POLICY, "maxParallelUpgrades": 2})
    ds_name = next(
        str(d.metadata.name)
        for d in kube.list(DaemonSet, namespace=operator_namespace)
        if str(d.metadata.name).startswith("nvidia-driver-daemonset")
    )
    deleted: dict[str, int] = {n: 0 for n in names}
    with StateRecorder(kube, names) as recorder:
        assert cli(control_plane, "upgrade", "pause").returncode == 0
        upgrade_driver(kube, "580.95.05")
        wait_for(
            "all upgrade-required",
            lambda: set(states(kube, names).values()) == {UPGRADE_REQUIRED},
            timeout=60,
        )
        time.sleep(5)  # several passes (2 s apart while upgrades are pending): none may start
        assert set(states(kube, names).values()) == {UPGRADE_REQUIRED}, recorder.history
        assert cli(control_plane, "upgrade", "resume").returncode == 0
        wait_for("a node in flight", lambda: any(s in ACTIVE for s in recorder.states.values()), timeout=60)
        operator.kill()
        start_operator()
        wait_for(
            "all upgrade-done",
            lambda: set(states(kube, names).values()) == {UPGRADE_DONE},
            timeout=180,
            context=lambda: str(states(kube, names)),
        )
    for name, history in recorder.history.items():
        assert history.count("pod-restart-required") == 1, (name, history)
        deleted[name] = history.count("cordon-required")
    assert all(v <= 1 for v in deleted.values()), deleted
    assert all(not kube.get(Node, n).spec.unschedulable for n in names)
    assert ds_name
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"driver": {"upgradePolicy": {"autoUpgrade": False}}}},
        patch_type=PatchType.MERGE,
    )
    wait_for("state labels removed", lambda: set(states(kube, names).values()) == {""}, timeout=60)


def test_each_nvidiadriver_upgrades_its_own_nodes_with_its_own_policy_and_pause(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    nvidia_drivers: Callable[..., str],
    operator_namespace: str,
    control_plane: ControlPlane,
) -> None:
    pool_a = fake_nodes("dgx-h100:3,pool=a")
    pool_b = fake_nodes("dgx-h100:2,pool=b")
    operator = start_operator()
    cluster_policies({"driver": {"useNvidiaDriverCRD": True}})
    nvidia_drivers(
        "pool-a",
        {
            "version": "570.172.08",
            "nodeSelector": {"pool": "a"},
            "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
        },
    )
    nvidia_drivers(
        "pool-b",
        {"version": "570.172.08", "nodeSelector": {"pool": "b"}, "upgradePolicy": {"autoUpgrade": False}},
    )
    wait_for(
        "pool a upgrade-done, both pools' driver pods placed",
        lambda: (
            set(states(kube, pool_a).values()) == {UPGRADE_DONE}
            and set(driver_pods(kube, operator_namespace)) >= {*pool_a, *pool_b}
        ),
        timeout=120,
        context=lambda: f"{states(kube, pool_a + pool_b)}\n{operator.log_text()[-3000:]}",
    )
    before = driver_pods(kube, operator_namespace)
    reconciled(kube, timeout=60, context=operator.log_text)
    upgrading = "; ".join(("ClusterPolicy is not ready", *st.UPGRADE_INCOMPLETE))

    with StateRecorder(kube, pool_a + pool_b) as recorder:
        paused = cli(control_plane, "upgrade", "pause", "--nvidiadriver", "pool-a")
        assert paused.returncode == 0 and "NVIDIADriver pool-a: driver upgrades paused" in paused.stdout, (
            paused
        )
        kube.patch(
            NVIDIADriverResource, "pool-a", {"spec": {"version": "580.95.05"}}, patch_type=PatchType.MERGE
        )
        # A pass that found all three waiting has recorded them (pool b adds none): paused, it started none.
        wait_for(
            "a pass with pool a's 3 nodes pending",
            lambda: upgrades_pending(operator),
            until=lambda v: v == 3,
            timeout=60,
            context=lambda: f"{states(kube, pool_a)}\n{operator.log_text()[-3000:]}",
        )
        assert set(states(kube, pool_a).values()) == {UPGRADE_REQUIRED}, recorder.history
        # pool a's nodes mid-upgrade keep the ClusterPolicy not ready (upstream's rule)
        wait_for(
            "ClusterPolicy not ready while pool a upgrades",
            lambda: policy_status(kube),
            until=lambda s: (
                s.get("state") == "notReady"
                and condition(s, "Error").get("reason") == "OperandNotReady"
                and condition(s, "Error").get("message") == upgrading
            ),
            timeout=30,
            context=operator.log_text,
        )
        shown = cli(control_plane, "upgrade", "status")
        assert "NVIDIADriver pool-a: autoUpgrade=True maxParallelUpgrades=1" in shown.stdout, shown
        assert "PAUSED (gpu-operator upgrade resume --nvidiadriver pool-a)" in shown.stdout, shown
        resumed = cli(control_plane, "upgrade", "resume")  # every NVIDIADriver
        assert "NVIDIADriver pool-a: driver upgrades resumed" in resumed.stdout, resumed
        wait_for(
            "pool a upgrade-done again",
            lambda: all(recorder.history[n][-2:] == [us.UNCORDON_REQUIRED, UPGRADE_DONE] for n in pool_a),
            timeout=120,
            context=lambda: f"{recorder.history}\n{operator.log_text()[-3000:]}",
        )
    reconciled(kube, timeout=30, context=operator.log_text)  # the last node's upgrade-done brings it back
    assert recorder.peak == 1, recorder.history  # maxParallelUpgrades 1, per NVIDIADriver
    for name in pool_a:
        assert recorder.history[name].count(us.POD_RESTART_REQUIRED) == 1, recorder.history
        assert not kube.get(Node, name).spec.unschedulable, name
    assert all(recorder.history[name] in ([], [""]) for name in pool_b), recorder.history  # autoUpgrade false
    after = driver_pods(kube, operator_namespace)
    assert all(after[n] != before[n] for n in pool_a)
    assert {n: after[n] for n in pool_b} == {n: before[n] for n in pool_b}


DeviceClass = create_global_resource("resource.k8s.io", "v1", "DeviceClass", "deviceclasses")


@pytest.fixture
def dra_driver(kube: Client, namespace: str) -> Iterator[Callable[[str], None]]:
    """`dra_driver(node)`: NVIDIA's standalone DRA driver beside the operator (the setup of upstream
    #2570): its gpu.nvidia.com DeviceClass and its kubelet plugin's DaemonSet on `node` (the
    simulator's plugin stand-in then publishes the node's ResourceSlice). The DeviceClass goes after
    the test (a GPUCluster's own would clash)."""
    account = "nvidia-dra-driver-gpu-kubelet-plugin"
    role = f"{account}-{namespace}"

    def install(node: str) -> None:
        for body in standalone_dra_driver(node, namespace, account, role):
            kube.create(from_dict(body))

    yield install
    delete_if_present(kube, DeviceClass, "gpu.nvidia.com")
    delete_if_present(kube, ClusterRoleBinding, role)
    delete_if_present(kube, ClusterRole, role)


def test_gpu_pod_deletion_evicts_dra_claim_and_runtime_class_holders_and_spares_a_plain_pod(
    kube: Client,
    upgrade_cluster: Callable[..., tuple[list[str], OperatorProcess]],
    dra_driver: Callable[[str], None],
    namespace: str,
) -> None:
    """The default path (no drain): GPU pod deletion finds a pod holding a gpu.nvidia.com claim
    allocated on the node and a pod under the nvidia RuntimeClass with NVIDIA_VISIBLE_DEVICES=all
    (neither requests nvidia.com/gpu), and leaves a pod that holds no GPU."""
    (node,), operator = upgrade_cluster(
        1,
        {"autoUpgrade": True, "maxUnavailable": "100%", "podDeletion": {"force": True, "timeoutSeconds": 60}},
    )
    dra_driver(node)
    on_node = {"kubernetes.io/hostname": node}
    workloads.claim_pod(kube, namespace, "dra", 1, node_selector=on_node)
    for name, extra in (("runtime", {"runtimeClassName": "nvidia"}), ("plain", {})):
        env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}] if extra else []
        workloads.create(
            kube,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "nodeSelector": on_node,
                    "terminationGracePeriodSeconds": 0,
                    **extra,
                    "containers": [{"name": "cuda", "image": "example.invalid/cuda:1", "env": env}],
                },
            },
        )

    def running() -> dict[str, str]:
        return {
            str(p.metadata.name): str(p.metadata.uid)
            for p in kube.list(Pod, namespace=namespace)
            if p.status
            and p.status.phase == "Running"
            and p.spec.nodeName == node
            and not p.metadata.deletionTimestamp
        }

    pods = wait_for(
        "the three pods running",
        running,
        until=lambda r: {"dra", "runtime", "plain"} <= set(r),
        timeout=90,
        context=lambda: str(kube.list(Pod, namespace=namespace)),
    )
    assert [(r["driver"], r["pool"]) for r in workloads.claim_results(kube, namespace, "dra")] == [
        ("gpu.nvidia.com", node)
    ]

    with StateRecorder(kube, [node]) as recorder:
        upgrade_driver(kube, "580.95.05")
        wait_for(
            "the node upgraded again",
            lambda: recorder.history[node][-2:] == [us.UNCORDON_REQUIRED, UPGRADE_DONE],
            timeout=120,
            context=lambda: f"{recorder.history}\n{operator.log_text()[-3000:]}",
        )
    assert (
        us.POD_DELETION_REQUIRED in recorder.history[node] and us.DRAIN_REQUIRED not in recorder.history[node]
    )
    left = {str(p.metadata.name): str(p.metadata.uid) for p in kube.list(Pod, namespace=namespace)}
    assert "dra" not in left and "runtime" not in left, left
    assert left.get("plain") == pods["plain"]  # the same pod, never evicted
