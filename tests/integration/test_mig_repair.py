"""MIG self-repair end to end on a kwok node, on the real control plane: the operator (real process,
a 20 s MIG change budget, retries after 5 s) deploys the MIG manager, whose stand-in
(sim/standins/migmanager.py) plays NVIDIA's. A GPU client pod that never stops wedges a MIG change (pending,
clients paused); past the budget the operator restores the paused deploy labels, says why in the
node's NvidiaMIGReady condition (the client that did not stop) and Events, and retries by restarting
the MIG manager pod; once the pod goes the change completes. A mig.config the layouts ConfigMap does
not have is reported with the valid names, and `doctor --node` reads the node's MIG state. A change
while a user's GPU pod runs fails (the GPUs are in use), is reported naming the pod, is retried and
completes once the pod is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod

from gpu_operator.controllers.units.mig import rules as mig_rules
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.integration.test_sim_mig import DEVICE_PLUGIN, MIG_CONFIG, STATE, History
from tests.support.hostsim import fakehost
from tests.support.waiting import wait_for
from tests.support.workloads import create

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
CONDITION = "NvidiaMIGReady"
OURS = "nvidia.com/gpu-operator.mig."
PAUSED = "paused-for-mig-change"


@pytest.fixture
def node_history(control_plane: ControlPlane) -> Iterator[Callable[[str], History]]:
    made: list[History] = []

    def start(node: str) -> History:
        made.append(History(control_plane, node))
        made[-1].thread.start()
        return made[-1]

    yield start
    for h in made:
        h.stop.set()
        h.client.close()


def node_facts(kube: Client, name: str) -> tuple[dict[str, str], dict[str, str], tuple[str, str, str] | None]:
    """(labels, our annotations, the NvidiaMIGReady condition's (status, reason, message))."""
    node = kube.get(Node, name)
    meta = node.metadata
    labels = dict((meta.labels if meta else None) or {})
    notes = {k: v for k, v in ((meta.annotations if meta else None) or {}).items() if k.startswith(OURS)}
    cond = next(
        (
            (c.status, c.reason or "", c.message or "")
            for c in (node.status.conditions if node.status else None) or []
            if c.type == CONDITION
        ),
        None,
    )
    return labels, notes, cond


def mig_manager_uids(kube: Client, namespace: str, node: str) -> set[str]:
    return {
        str(p.metadata.uid)
        for p in kube.list(
            Pod, namespace=namespace, labels={"app": "nvidia-mig-manager"}, fields={"spec.nodeName": node}
        )
        if p.metadata and not p.metadata.deletionTimestamp
    }


def stuck_client(kube: Client, namespace: str, node: str) -> None:
    """A GPU client pod (the MIG manager waits for app=nvidia-dcgm to leave) that never stops: owned by
    a ConfigMap, so the nvidia-dcgm DaemonSet (same app label) neither adopts nor deletes it."""
    owner = kube.create(ConfigMap(metadata=ObjectMeta(name="dcgm-stuck-owner", namespace=namespace)))
    uid = str(owner.metadata.uid if owner.metadata else "")
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "nvidia-dcgm-stuck",
                "namespace": namespace,
                "labels": {"app": "nvidia-dcgm"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "dcgm-stuck-owner",
                        "uid": uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "dcgm", "image": "nvcr.io/nvidia/cloud-native/dcgm"}],
            },
        },
    )


def test_a_mig_change_wedged_by_a_client_is_restored_reported_retried_and_completes(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
    node_history: Callable[[str], History],
    control_plane: ControlPlane,
    tmp_path: Path,
) -> None:
    node = fake_nodes("dgx-h100:1")[0]
    seen = node_history(node)
    operator = start_operator(extra_args=["--mig-change-budget=20", "--mig-retry-after=5"])
    cluster_policies({"migManager": {"config": {"default": "all-disabled"}}})

    def facts() -> tuple[dict[str, str], dict[str, str], tuple[str, str, str] | None]:
        return node_facts(kube, node)

    labels, notes, cond = wait_for(
        "all-disabled applied and reported",
        facts,
        timeout=180,
        context=operator.log_text,
        until=lambda f: f[2] is not None and f[2][1] == "MIGConfigApplied",
    )
    assert cond == ("True", "MIGConfigApplied", "MIG config 'all-disabled' applied") and notes == {}
    first_manager = mig_manager_uids(kube, operator_namespace, node)
    assert len(first_manager) == 1

    stuck_client(kube, operator_namespace, node)
    mark = len(seen.seen)
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})

    # past the 20 s budget: stuck, the client named, the paused labels restored while still pending
    labels, notes, cond = wait_for(
        "the change found stuck",
        facts,
        timeout=120,
        context=operator.log_text,
        until=lambda f: f[2] is not None and f[2][1] == "MIGChangeStuck",
    )
    why = (
        "MIG config 'all-1g.10gb' pending past the 20 s budget: GPU clients that did not stop: "
        f"{operator_namespace}/nvidia-dcgm-stuck; they are restored on the current layout and the change is retried"
    )
    assert cond == ("False", "MIGChangeStuck", why)
    steps = seen.since(mark)
    assert ("pending", PAUSED) in steps, steps
    wait_for(
        "the paused deploy labels restored while the change is stuck",
        lambda: seen.since(mark),
        timeout=60,
        context=operator.log_text,
        until=lambda s: ("pending", "true") in s[s.index(("pending", PAUSED)) :],
    )

    # the retry: the MIG manager pod restarted, its start runs the change again (paused again)
    wait_for(
        "the MIG manager pod restarted",
        lambda: mig_manager_uids(kube, operator_namespace, node),
        timeout=90,
        context=operator.log_text,
        until=lambda uids: bool(uids) and not uids & first_manager,
    )
    restored_at = seen.since(mark).index(("pending", "true")) + mark
    wait_for(
        "the retried change pauses the clients again",
        lambda: seen.since(restored_at),
        timeout=60,
        context=operator.log_text,
        until=lambda s: ("pending", PAUSED) in s,
    )
    node_events = [
        e
        for e in kube.list(Event, namespace="default", fields={"involvedObject.name": node})
        if e.reason == "MIGChange"
    ]
    assert [(e.type, e.message) for e in node_events if e.type == "Warning"][:1] == [
        ("Warning", f"MIGChangeStuck: {why}")
    ]
    policy_events = [
        e
        for e in kube.list(Event, namespace="default", fields={"involvedObject.kind": "ClusterPolicy"})
        if e.reason == "MIGChange"
    ]
    assert f"node {node}: MIGChangeStuck: {why}" in [e.message for e in policy_events]

    # the client goes: the (re)tried change completes, the operator forgets its memory of it
    kube.delete(Pod, "nvidia-dcgm-stuck", namespace=operator_namespace, grace_period=0)
    labels, notes, cond = wait_for(
        "all-1g.10gb applied once the client went",
        facts,
        timeout=180,
        context=operator.log_text,
        until=lambda f: (
            f[0].get(STATE) == "success" and f[2] is not None and f[2][1] == "MIGConfigApplied" and f[1] == {}
        ),
    )
    assert cond == ("True", "MIGConfigApplied", "MIG config 'all-1g.10gb' applied")
    assert labels[DEVICE_PLUGIN] == "true"

    # a config the layouts ConfigMap does not have: reported with the valid names, never retried
    layouts = kube.get(ConfigMap, "default-mig-parted-config", namespace=operator_namespace)
    names = sorted(yaml.safe_load((layouts.data or {})["config.yaml"])["mig-configs"])
    manager = mig_manager_uids(kube, operator_namespace, node)
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-9g.99gb"}}})
    labels, notes, cond = wait_for(
        "the invalid config reported",
        facts,
        timeout=60,
        context=operator.log_text,
        until=lambda f: f[2] is not None and f[2][1] == "InvalidMIGConfig",
    )
    assert labels[STATE] == "failed"
    assert cond == (
        "False",
        "InvalidMIGConfig",
        "nvidia.com/mig.config 'all-9g.99gb' is not a config of ConfigMap "
        f"default-mig-parted-config; valid names: {', '.join(names)}",
    )
    assert mig_manager_uids(kube, operator_namespace, node) == manager

    # doctor --node reads the same from the Node
    host = fakehost.build_file(HOSTS / "h100-nvidia-bound.yaml", tmp_path / "root")
    env = {**os.environ, "NODE_NAME": node, "KUBECONFIG": str(control_plane.admin_kubeconfig)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "doctor",
            f"--host-root={host.fs.root}",
            "--json",
            "--no-commands",
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    found = {f["code"]: f for f in json.loads(done.stdout)["findings"]}
    assert found["mig-node-state"]["summary"] == "MIG config all-9g.99gb: failed"
    assert found["mig-change-failed"]["severity"] == "warning"


def test_a_mig_change_while_a_gpu_pod_runs_is_blocked_reported_and_completes_when_the_pod_goes(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    namespace: str,
    node_history: Callable[[str], History],
) -> None:
    node = fake_nodes("dgx-h100:1")[0]
    seen = node_history(node)
    operator = start_operator(extra_args=["--mig-change-budget=20", "--mig-retry-after=5"])
    cluster_policies({"mig": {"strategy": "single"}, "migManager": {"config": {"default": "all-disabled"}}})

    def facts() -> tuple[dict[str, str], dict[str, str], tuple[str, str, str] | None]:
        return node_facts(kube, node)

    def capacity() -> dict[str, str]:
        status = kube.get(Node, node).status
        return {k: str(v) for k, v in ((status.allocatable if status else None) or {}).items()}

    wait_for(
        "all-disabled applied",
        facts,
        timeout=180,
        context=operator.log_text,
        until=lambda f: f[2] is not None and f[2][1] == "MIGConfigApplied",
    )
    wait_for(
        "the 8 GPUs advertised",
        capacity,
        timeout=120,
        context=operator.log_text,
        until=lambda c: c.get("nvidia.com/gpu") == "8",
    )
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train", "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "cuda",
                        "image": "nvcr.io/nvidia/cuda",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )
    wait_for(
        "the GPU pod running",
        lambda: kube.get(Pod, "train", namespace=namespace).status,
        timeout=60,
        until=lambda st: st is not None and st.phase == "Running",
    )

    mark = len(seen.seen)
    kube.patch(Node, node, {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    why = mig_rules.failed_message(
        mig_rules.MIGFacts(
            node,
            "all-1g.10gb",
            "failed",
            (),
            mig_rules.ManagerPresence.RUNNING,
            holders=(f"{namespace}/train",),
        )
    )
    labels, _, cond = wait_for(
        "the change refused while the pod holds a GPU, reported naming it",
        facts,
        timeout=90,
        context=operator.log_text,
        until=lambda f: f[2] == ("False", "MIGConfigFailed", why),
    )
    steps = seen.since(mark)
    assert ("pending", PAUSED) in steps and ("failed", "true") in steps, (
        steps
    )  # paused, then clients restored
    # The old layout still serves: the device plugin, paused and restored, registers again and
    # its capacity reaches the Node's status a moment later (read once, it was 0 in one run).
    wait_for(
        "the old layout served again (8 nvidia.com/gpu allocatable)",
        capacity,
        timeout=60,
        until=lambda c: c.get("nvidia.com/gpu") == "8",
    )
    node_events = [
        e.message
        for e in kube.list(Event, namespace="default", fields={"involvedObject.name": node})
        if e.reason == "MIGChange" and e.type == "Warning"
    ]
    assert f"MIGConfigFailed: {why}" in node_events

    kube.delete(Pod, "train", namespace=namespace, grace_period=0)
    labels, notes, cond = wait_for(
        "the retried change applied once the pod went",
        facts,
        timeout=120,
        context=operator.log_text,
        until=lambda f: f[0].get(STATE) == "success" and f[2] is not None and f[2][1] == "MIGConfigApplied",
    )
    assert (
        cond == ("True", "MIGConfigApplied", "MIG config 'all-1g.10gb' applied")
        and labels[DEVICE_PLUGIN] == "true"
    )
    wait_for(
        "the MIG devices advertised",
        capacity,
        timeout=60,
        context=operator.log_text,
        until=lambda c: c.get("nvidia.com/gpu") == "56",
    )
