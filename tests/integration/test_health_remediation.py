"""GPU health remediation end to end: the operator process, a ClusterPolicy with
`spec.health.remediation.enabled`, kwok GPU nodes whose operator-validator pods (the operator's own
DaemonSet) run the health agent's stand-in over the nodes' host trees, and faults injected with
the simulator's fault injection (`sim/commands/faultinject.py`, what `gpu-operator sim fault` runs).

The issue's list: Xid 79 on one GPU -> condition, taint, drain, reboot (the catalogue's action for
79, RESTART_BM), back; Xid 13 -> warning only, no taint; Xid 48 on two nodes with maxUnavailable
1 -> one at a time; remediation failing 3 times -> failed with its reason; the operator killed
mid-remediation -> resumes; a node mid driver-upgrade -> remediation waits. There is no kured in
the simulator: where the agent has created the reboot sentinel, the test reboots the node with
`--clear`, as kured would.

Only structured fields are read: the condition's status and reason, taint keys, the state labels,
annotations, the report's fields (api/health.py) and the fault book. One operator, policy and set
of nodes serve the whole module (a ClusterPolicy's first reconcile is most of the cost); each
scenario has nodes of its own and sets the remediation it needs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from gpu_operator.controllers.units.health import machine as hm
from gpu_operator.controllers.units.upgrade.state import ACTIVE as UPGRADE_ACTIVE
from gpu_operator.controllers.units.upgrade.state import UPGRADE_DONE, WAIT_FOR_JOBS_REQUIRED
from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.commands.faultinject import inject
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware.faults import BOOK, NodeHosts, node_host_spec
from gpu_operator.sim.plane import nodes as sim_nodes
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.standins import roster
from gpu_operator.sim.standins.health import INTERVAL
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_REQUESTS_SECRET,
    HEALTH_TAINT,
    UPGRADE_REQUESTED_ANNOTATION,
)
from tests.support import workloads
from tests.support.cleanup import delete_if_present
from tests.support.remediation import Recorder, Seen
from tests.support.status import reconciled
from tests.support.waiting import wait_for

POLICY = "cluster-policy"
SHAPE = "dgx-h100"
JOB = "long-job"  # the driver upgrade waits for pods with this app label (waitForCompletion)
SCENARIO = 75.0  # seconds any one wait may take on a busy 2-core machine


@dataclass
class Cluster:
    kube: Client
    plane: ControlPlane
    namespace: str
    sim: SimState
    hosts: NodeHosts
    spare: list[str]
    base: Path
    operators: list[OperatorProcess] = field(default_factory=list)

    def nodes(self, count: int) -> list[str]:
        taken, self.spare = self.spare[:count], self.spare[count:]
        assert len(taken) == count, "the module's nodes are used up: add more in the fixture"
        return taken

    def seen(self, node: str) -> Seen:
        return Seen.of(self.kube.get(Node, node))

    def wait(self, what: str, node: str, until: Callable[[Seen], Any], timeout: float = SCENARIO) -> Seen:
        return wait_for(
            f"{node}: {what}", lambda: self.seen(node), until=until, timeout=timeout, context=self.logs
        )

    def logs(self) -> str:
        return "\n".join(
            f"--- operator {i} ---\n{op.log_text()[-3000:]}" for i, op in enumerate(self.operators)
        )

    def remediation(self, **spec: Any) -> None:
        self.kube.patch(
            ClusterPolicyResource,
            POLICY,
            {"spec": {"health": {"remediation": {"enabled": True, **spec}}}},
            patch_type=PatchType.MERGE,
        )

    def start_operator(self) -> OperatorProcess:
        proc = OperatorProcess(
            kubeconfig=self.plane.kubeconfig_for("operator"),
            namespace=self.namespace,
            log=self.base / f"operator-{len(self.operators)}.log",
        ).start()
        self.operators.append(proc)
        return proc

    def fault(self, node: str, action: str, xid: int | None = None, gpu: int | None = None) -> None:
        inject(self.sim, node, action, xid, gpu)

    def bus(self, node: str, gpu: int) -> str:
        return next(g.address for g in self.hosts.gpus(node) if g.index == gpu)

    def hold(self, node: str, gpu: int, pid: int = 4242) -> Path:
        """A process of the node's host that holds GPU `gpu` open (its /proc entry in the node's
        own tree, made now if the node has none yet: before the fault, so that no reset can come
        first)."""
        minor = self.hosts.faults(node, node_host_spec(SHAPE)).book().gpus[gpu].minor
        proc = self.hosts.root(node) / "proc" / str(pid)
        (proc / "fd").mkdir(parents=True)
        (proc / "comm").write_text("python3\n")
        (proc / "fd" / "7").symlink_to(f"/dev/nvidia{minor}")
        return proc

    def request(self, node: str) -> dict[str, Any] | None:
        """The node's entry in the operator's requests Secret (None: none, or no Secret)."""
        import base64

        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Secret

        try:
            secret = self.kube.get(Secret, HEALTH_REQUESTS_SECRET, namespace=self.namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise
        raw = (secret.data or {}).get(node)
        return cast(dict[str, Any], json.loads(base64.b64decode(raw))) if raw else None

    def xids(self, node: str) -> list[dict[str, int]]:
        """The Xids the node's host holds this boot (its fault book)."""
        return cast(list[dict[str, int]], json.loads((self.hosts.base / node / BOOK).read_text())["xids"])


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, kube: Client, crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("health-remediation")
    namespace = f"gpu-operator-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    names = sim_nodes.add_nodes(kube, [f"{SHAPE}:9"], start=90_000)
    sim = SimState(
        dir=str(base),
        server=control_plane.server,
        kubeconfig=str(control_plane.admin_kubeconfig),
        binaries="",
    )
    found = Cluster(kube, control_plane, namespace, sim, NodeHosts(base / "hosts"), list(names), base)
    try:
        sim_nodes.wait_ready(kube, names)
        config = KubeConfig.from_file(control_plane.admin_kubeconfig)
        with roster.running(config, nodes=False, hosts=base / "hosts") as agents:
            found.start_operator()
            kube.create(
                ClusterPolicyResource(  # type: ignore[call-overload]
                    apiVersion="nvidia.com/v1",
                    kind="ClusterPolicy",
                    metadata={"name": POLICY},
                    spec={
                        "driver": {
                            "upgradePolicy": {
                                "autoUpgrade": True,
                                "maxUnavailable": "100%",
                                "waitForCompletion": {"podSelector": f"app={JOB}"},
                            }
                        },
                        "health": {"remediation": {"enabled": True}},
                    },
                )
            )
            reconciled(kube, timeout=180, context=found.logs)
            for name in names:  # the agents' first reports: every GPU healthy, validated
                found.wait(
                    "first health report",
                    name,
                    lambda s: (
                        s.report is not None and s.report.ready and s.condition == ("True", "GPUsHealthy")
                    ),
                    timeout=90,
                )
            yield found
        assert agents.error is None, f"the health agent's stand-in failed: {agents.error!r}"
    finally:
        for proc in found.operators:
            if proc.alive:
                proc.stop()
        delete_if_present(kube, ClusterPolicyResource, POLICY)
        sim_nodes.remove_nodes(kube, names)
        delete_if_present(kube, Namespace, namespace)


# -- the scenarios ------------------------------------------------------------------------------


def test_xid_79_quarantines_drains_reboots_and_brings_the_node_back(cluster: Cluster, namespace: str) -> None:
    (node,) = cluster.nodes(1)
    cluster.remediation(
        maxUnavailable=1,
        actions=["restart-device-plugin", "reset-gpu", "reboot"],
        validationTimeoutSeconds=600,
        maxAttempts=3,
    )
    workloads.create(
        cluster.kube,
        workloads.gpu_deployment("train", namespace, 1, node_selector={"kubernetes.io/hostname": node}),
    )
    pod = wait_for(
        "the GPU pod running on the node",
        lambda: [
            p
            for p in cluster.kube.list(Pod, namespace=namespace)
            if p.status and p.status.phase == "Running" and p.spec and p.spec.nodeName == node
        ],
        timeout=SCENARIO,
    )[0]
    with Recorder(cluster.kube, [node]) as recorder:
        cluster.fault(node, "xid", 79, 1)
        bus = cluster.bus(node, 1)
        # the catalogue's action for 79 is reboot (RESTART_BM): the walk requests a reboot
        asked = cluster.wait(
            "the agent's reboot sentinel for remediation's request",
            node,
            lambda s: (
                s.report is not None
                and s.report.answered is not None
                and s.condition == ("False", "Remediating")
            ),
        )
        assert (cluster.hosts.root(node) / "var/run/reboot-required").is_file()
        assert asked.state == hm.VALIDATING and asked.notes.get(hm.ACTION) == "reboot"
        assert asked.report is not None and asked.report.answered == f"reboot:0:{asked.notes[hm.SINCE]}"
        # answered: the operator notes it and withdraws the request (the agent never writes it)
        withdrawn = cluster.wait(
            "the request withdrawn",
            node,
            lambda s: s.notes.get(hm.ANSWERED) == s.notes.get(hm.SINCE) and cluster.request(node) is None,
        )
        assert withdrawn.state == hm.VALIDATING
        assert asked.condition == ("False", "Remediating") and HEALTH_TAINT in asked.taints and asked.cordoned
        (gpu,) = asked.report.unhealthy
        assert (gpu.bus, gpu.xid, gpu.action) == (bus, 79, "reboot")
        evicted = cluster.kube.list(
            Pod, namespace=namespace, fields={"metadata.name": str(pod.metadata.name)}
        )
        assert [p for p in evicted if p.metadata and p.metadata.deletionTimestamp is None] == []  # drained
        cluster.fault(node, "clear")  # kured's part: the reboot
        back = cluster.wait("released after the reboot", node, lambda s: s.released)
    assert back.report is not None and back.report.ready and back.report.reboot is None  # a new agent
    assert recorder.states(node) == ["", hm.QUARANTINED, hm.DRAINING, hm.ACTING, hm.VALIDATING, ""]
    assert not (cluster.hosts.root(node) / "var/run/reboot-required").exists()


def test_xid_13_is_a_warning_only(cluster: Cluster) -> None:
    (node,) = cluster.nodes(1)
    cluster.remediation(maxUnavailable=1)
    with Recorder(cluster.kube, [node]) as recorder:
        cluster.fault(node, "xid", 13, 2)
        warned = cluster.wait("condition GPUWarning", node, lambda s: s.condition == ("False", "GPUWarning"))
        assert warned.report is not None and [g.state for g in warned.report.gpus] == ["warning"]
        # whoever may patch a Node asks nothing of its agent: the old request annotations do nothing
        cluster.kube.patch(
            Node,
            node,
            {
                "metadata": {
                    "annotations": {
                        "nvidia.com/gpu-health.reboot-requested": "1",
                        "nvidia.com/gpu-health.reset-requested": "all",
                    }
                }
            },
        )
        time.sleep(4)  # passes after the report's (the live agent steps every 2 s): still no quarantine
        after = cluster.seen(node)
    assert not (cluster.hosts.root(node) / "var/run/reboot-required").exists()
    assert after.report is not None and after.report.reset == {} and after.report.answered is None
    assert after.condition == ("False", "GPUWarning") and HEALTH_TAINT not in after.taints
    assert after.state == "" and not after.cordoned and recorder.states(node) == [""]


def test_xid_48_on_two_nodes_with_max_unavailable_1_one_at_a_time(cluster: Cluster) -> None:
    pair = cluster.nodes(2)
    cluster.remediation(maxUnavailable=1, actions=["reset-gpu", "reboot"], validationTimeoutSeconds=600)
    with Recorder(cluster.kube, pair) as recorder:
        for node in pair:
            cluster.fault(node, "xid", 48, 0)
        for node in pair:
            # reset on the host (only a reset clears its Xid there), then validated afresh by a new
            # validator pod (whose agent starts without the old one's outcomes) and released
            back = cluster.wait(
                "reset and released",
                node,
                lambda s, n=node: (
                    s.released  # type: ignore[misc]
                    and cluster.xids(n) == []
                ),
            )
            assert cluster.request(node) is None  # withdrawn
            assert back.report is not None and back.report.validatedAt is not None
            clients = {
                k: v for k, v in cluster.kube.get(Node, node).metadata.labels.items() if k in hm.GPU_CLIENTS
            }
            assert clients == dict.fromkeys(hm.GPU_CLIENTS, "true")  # paused for the reset, and back
    active = (hm.DRAINING, hm.ACTING, hm.VALIDATING)
    current: dict[str, str] = {}
    peak = 0
    for name, state, _ in recorder.timeline:
        current[name] = state
        peak = max(peak, sum(1 for s in current.values() if s in active))
    assert peak == 1
    for node in pair:
        assert recorder.states(node) == ["", hm.QUARANTINED, hm.DRAINING, hm.ACTING, hm.VALIDATING, ""]
        assert cluster.xids(node) == []  # the reset cleared the GPU's Xid on the host


def test_remediation_failing_3_times_leaves_the_node_failed_with_its_reason(cluster: Cluster) -> None:
    (node,) = cluster.nodes(1)
    # Each attempt's request must live long enough for the agent (a step every INTERVAL s) to see
    # and refuse it: with 1 s an attempt could end before the agent looked (seen under load).
    cluster.remediation(
        maxUnavailable=1, actions=["reset-gpu"], maxAttempts=3, validationTimeoutSeconds=int(3 * INTERVAL)
    )
    cluster.hold(node, 1)  # a process on the host holds the GPU: the agent never resets it
    cluster.fault(node, "xid", 48, 1)
    failed = cluster.wait(
        "failed after 3 attempts",
        node,
        lambda s: s.state == hm.FAILED and s.condition == ("False", "RemediationFailed"),
        timeout=2 * SCENARIO,
    )
    assert failed.notes.get(HEALTH_ATTEMPTS_ANNOTATION) == "3" and failed.notes.get(hm.REASON)
    assert HEALTH_TAINT in failed.taints
    assert failed.report is not None
    kind, why = failed.report.reset_outcome(cluster.bus(node, 1)) or ("", "")
    assert (kind, why) == ("refused", "held by pid 4242 (python3)")  # not a paused client: it keeps the GPU
    assert [x["xid"] for x in cluster.xids(node)] == [48]  # never reset
    assert cluster.request(node) is None  # the failed machine withdrew its request


def test_an_operator_killed_mid_remediation_resumes_where_the_node_is(cluster: Cluster) -> None:
    (node,) = cluster.nodes(1)
    cluster.remediation(maxUnavailable=1, actions=["reset-gpu"], validationTimeoutSeconds=600, maxAttempts=3)
    holder = cluster.hold(node, 3)
    cluster.fault(node, "xid", 48, 3)
    bus = cluster.bus(node, 3)
    waiting = cluster.wait(
        "validating, the reset refused",
        node,
        lambda s: (
            s.state == hm.VALIDATING
            and s.report is not None
            and (s.report.reset_outcome(bus) or ("",))[0] == "refused"
        ),
    )
    asked = cluster.request(node)
    assert asked is not None and asked["action"] == "reset-gpu" and asked["gpus"] == [bus]
    assert asked["since"] == waiting.notes[hm.SINCE] and asked["remediation"] is True
    with Recorder(cluster.kube, [node]) as recorder:
        operator = cluster.operators[-1]
        operator.kill()  # SIGKILL mid-remediation
        for entry in sorted(holder.rglob("*"), reverse=True):  # the holder exits: the agent resets the GPU
            entry.unlink() if entry.is_symlink() or entry.is_file() else entry.rmdir()
        holder.rmdir()
        reset = cluster.wait(
            "the agent's reset while no operator runs",
            node,
            lambda s: (
                s.report is not None
                and s.report.reset_outcome(bus) == ("done", "")
                and s.report.answered is not None
            ),
        )
        assert reset.state == hm.VALIDATING  # nobody moved it
        cluster.start_operator()
        cluster.wait("released by the new operator", node, lambda s: s.released)
    # resumed from validating: never back through quarantine or drain
    assert recorder.states(node) == [hm.VALIDATING, ""]


def test_a_node_mid_driver_upgrade_waits_for_it_before_remediation(cluster: Cluster, namespace: str) -> None:
    (node,) = cluster.nodes(1)
    cluster.remediation(maxUnavailable=1, actions=["reset-gpu"], validationTimeoutSeconds=600)
    job = Pod.from_dict(
        {
            "metadata": {"name": "job", "namespace": namespace, "labels": {"app": JOB}},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "example.invalid/job:1"}],
            },
        }
    )
    cluster.kube.create(job)  # type: ignore[call-overload]
    with Recorder(cluster.kube, [node]) as recorder:
        cluster.kube.patch(Node, node, {"metadata": {"annotations": {UPGRADE_REQUESTED_ANNOTATION: "true"}}})
        cluster.wait(
            "the driver upgrade waiting for the job", node, lambda s: s.upgrade == WAIT_FOR_JOBS_REQUIRED
        )
        cluster.fault(node, "xid", 48, 0)
        held = cluster.wait(
            "quarantined", node, lambda s: s.state == hm.QUARANTINED and HEALTH_TAINT in s.taints
        )
        assert held.condition == ("False", "GPUUnhealthy")
        time.sleep(4)  # the passes that follow: remediation still waits for the upgrade
        assert cluster.seen(node).state == hm.QUARANTINED
        cluster.kube.delete(Pod, "job", namespace=namespace)  # the job ends: the upgrade goes on
        cluster.wait("released after the upgrade", node, lambda s: s.released and s.upgrade == UPGRADE_DONE)
    assert recorder.states(node) == ["", hm.QUARANTINED, hm.DRAINING, hm.ACTING, hm.VALIDATING, ""]
    # one owner of the cordon at a time: never remediating while the upgrade was between states
    assert not [
        t
        for t in recorder.timeline
        if t[0] == node and t[1] in (hm.DRAINING, hm.ACTING, hm.VALIDATING) and t[2] in UPGRADE_ACTIVE
    ]
