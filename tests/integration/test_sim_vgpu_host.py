"""Our vGPU host-state agent played on kwok vGPU hosts (sim/standins/vgpustandin.py) and a reboot of one
(`sim fault --reboot`): the operator (a real process) puts the sandbox validator's DaemonSet, with
its vgpu-host-state init container, on vm-vgpu nodes; the real DaemonSet controller places its pod,
kwok runs it, and the stand-in runs the agent's pass against that node's own host tree with the
pod's env and the user's vGPU config. A reboot loses the VFs, vGPUs and MIG mode; the kubelet's
shutdown ends the pod, the DaemonSet makes a new one, and its pass restores exactly what was there.
A second vGPU host whose admin opted it out of the sandbox validator runs no pod and gets nothing.
Real components: kube-apiserver, kube-controller-manager (DaemonSets), kwok, the operator."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.vgpuhost import sysfs
from gpu_operator.node.vgpuhost.agent import (
    VGPU_HOST_RESTORED_REASON,
    VGPU_HOST_RESULT_ANNOTATION,
    VGPU_HOST_STATE,
)
from gpu_operator.node.vgpuhost.config import vgpu_gpus
from gpu_operator.sim.commands.faultinject import check_action, inject
from gpu_operator.sim.commands.state import SimState
from gpu_operator.sim.hardware.faults import BOOT_ID, NodeHosts, boot_id, node_host_spec
from gpu_operator.sim.hardware.vgpuhw import VGPU_STATE, VgpuHostSim
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.standins import roster
from gpu_operator.sim.standins.vgpustandin import APP
from gpu_operator.vocabulary import deploy_label
from tests.support.waiting import wait_for

SHAPE = "vgpu-host-h100"
# Two GPUs with MIG-backed vGPUs (MIG mode on, lost at a Hopper reboot), the other six time-sliced.
CONFIG = """\
version: v1
vgpu-configs:
  lab:
    - devices: [0, 1]
      vgpu-devices:
        H100XM-1-10C: 3
    - devices: all
      vgpu-devices:
        H100XM-20C: 4
"""


def labels(kube: Client, node: str) -> dict[str, str]:
    meta = kube.get(Node, node).metadata
    return dict((meta.labels if meta else None) or {})


def result(kube: Client, node: str) -> dict[str, Any]:
    meta = kube.get(Node, node).metadata
    text = ((meta.annotations if meta else None) or {}).get(VGPU_HOST_RESULT_ANNOTATION)
    return json.loads(text) if text else {}


def validator_pod(kube: Client, namespace: str, node: str) -> tuple[str, str] | None:
    """(name, uid) of the sandbox validator's Running pod on `node`, if any."""
    for pod in kube.list(Pod, namespace=namespace, labels={"app": APP}, fields={"spec.nodeName": node}):
        if (
            pod.status
            and pod.status.phase == "Running"
            and pod.metadata
            and not pod.metadata.deletionTimestamp
        ):
            return str(pod.metadata.name), str(pod.metadata.uid)
    return None


def restored_events(kube: Client, node: str) -> int:
    return sum(
        1
        for e in kube.list(Event, namespace="*")
        if e.reason == VGPU_HOST_RESTORED_REASON and e.involvedObject.name == node
    )


def snapshot(root: Path, state: Path) -> dict[str, Any]:
    """Each GPU's VFs, each VF's vGPU type id, MIG mode (current, pending), read back from the tree
    (and the GPUs' MIG mode beside it)."""
    fs = HostFS(root)
    spec = node_host_spec(SHAPE)
    hardware = VgpuHostSim(fs, spec, state)
    out: dict[str, Any] = {}
    for gpu in vgpu_gpus(fs):
        pf = sysfs.read_pf(fs, gpu.address)
        out[gpu.address] = (pf.numvfs, [vf.current for vf in pf.vfs], hardware.mig_mode(gpu.address))
    return out


def test_vgpu_host_state_restored_after_a_reboot_only_where_the_pod_runs(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
    tmp_path: Path,
) -> None:
    host, opted_out = fake_nodes(f"{SHAPE}:2")
    kube.patch(Node, opted_out, {"metadata": {"labels": {deploy_label("sandbox-validator"): "false"}}})
    kube.create(
        ConfigMap(
            metadata=ObjectMeta(name="vgpu-lab", namespace=operator_namespace), data={"config.yaml": CONFIG}
        )
    )
    state = SimState(
        dir=str(tmp_path),
        server=control_plane.server,
        kubeconfig=str(control_plane.admin_kubeconfig),
        binaries="",
    )
    hosts = NodeHosts(tmp_path / "hosts")
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    with roster.running(config, nodes=False, hosts=hosts.base, agents=True) as agents:
        operator = start_operator()
        cluster_policies(
            {
                "sandboxWorkloads": {"enabled": True},
                "vgpuManager": {"enabled": False},  # the vGPU manager is installed on these hosts
                "vgpuDeviceManager": {"enabled": True, "config": {"name": "vgpu-lab", "default": "lab"}},
            }
        )
        wait_for(
            f"the vGPU host state on {host}",
            lambda: labels(kube, host).get(VGPU_HOST_STATE),
            until=lambda s: s == "restored",
            timeout=60,
            context=operator.log_text,
        )
        first_pod = validator_pod(kube, operator_namespace, host)
        assert first_pod is not None
        root, mig = hosts.root(host), hosts.base / host / VGPU_STATE
        before = snapshot(root, mig)
        assert len(before) == 8
        for i, (numvfs, types, mode) in enumerate(before.values()):
            want = [1061] * 3 if i < 2 else [1059] * 4  # H100XM-1-10C, H100XM-20C (the model's type ids)
            assert (numvfs, types[: len(want)], types[len(want) :]) == (16, want, [0] * (16 - len(want)))
            assert mode == ((True, True) if i < 2 else (False, False))
        first = result(kube, host)
        assert first["config"] == "lab" and first["state"] == "restored"
        assert {(s["step"], s["outcome"]) for s in first["steps"]} == {
            ("mig-mode", "changed"),
            ("mig-mode", "ok"),
            ("vfs", "changed"),
            ("vgpu-types", "changed"),
            ("fabric-manager", "changed"),
        }
        boot = boot_id(HostFS(root))

        assert check_action(None, False, False, None, True) == ("reboot", None)
        said = inject(state, host, "reboot", None, None)
        print(said)
        assert said.startswith(f"node {host}: rebooted: 8 GPU(s) with no VF or vGPU, MIG mode off")

        second_pod = wait_for(
            "a new sandbox validator pod, restored again",
            lambda: validator_pod(kube, operator_namespace, host),
            until=lambda p: p is not None and p != first_pod and restored_events(kube, host) == 2,
            timeout=60,
            context=operator.log_text,
        )
        assert second_pod is not None and second_pod[1] != first_pod[1]
        assert boot_id(HostFS(root)) != boot and HostFS(root).exists(BOOT_ID)
        after = result(kube, host)
        # what the new pod's pass found: the reboot took the VFs, the vGPUs and (Hopper) MIG mode
        steps = {(s["gpu"], s["step"]): s for s in after["steps"]}
        for i, gpu in enumerate(before):
            assert steps[(gpu, "vfs")]["outcome"] == "changed"
            assert steps[(gpu, "vfs")]["detail"] == "enabled 16 VFs (had 0)"
            assert steps[(gpu, "vgpu-types")]["outcome"] == "changed"
            assert steps[(gpu, "mig-mode")]["outcome"] == ("changed" if i < 2 else "ok")
        assert steps[("node", "fabric-manager")]["outcome"] == "ok"  # a file on disk: kept
        assert snapshot(root, mig) == before

        # a rollout: one more pod, one more pass
        kube.delete(Pod, second_pod[0], namespace=operator_namespace)
        wait_for(
            "the third pod's pass",
            lambda: labels(kube, host).get(VGPU_HOST_STATE),
            until=lambda s: s == "unchanged",
            timeout=60,
            context=operator.log_text,
        )
        assert {s["outcome"] for s in result(kube, host)["steps"]} == {"ok"}
        assert snapshot(root, mig) == before
        assert restored_events(kube, host) == 2
    assert agents.error is None, agents.error
    # the opted-out vGPU host ran no sandbox validator pod: no pass, no tree of its own, nothing on its Node
    assert validator_pod(kube, operator_namespace, opted_out) is None
    assert VGPU_HOST_STATE not in labels(kube, opted_out) and result(kube, opted_out) == {}
    assert not hosts.has(opted_out)


def test_while_the_pass_fails_the_pod_is_held_in_its_init_containers_and_the_daemonset_not_ready(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
    tmp_path: Path,
) -> None:
    """A vGPU config name the file does not have: the init container's pass fails, and the kubelet
    would restart it without end. The pod's status says so (phase Pending, Initialized False,
    vgpu-host-state in CrashLoopBackOff with its restarts, the main container PodInitializing) and
    the sandbox validator's DaemonSet counts it not ready; the node's label naming a config the file
    has lets the next restart pass, and kwok marks the pod Running and Ready."""
    from lightkube.resources.apps_v1 import DaemonSet

    from gpu_operator.node.vgpuhost.agent import VGPU_CONFIG
    from gpu_operator.render.states.sandbox_validation import NAME as VALIDATOR
    from gpu_operator.sim.standins.vgpustandin import INIT

    (host,) = fake_nodes(f"{SHAPE}:1")
    kube.create(
        ConfigMap(
            metadata=ObjectMeta(name="vgpu-lab", namespace=operator_namespace), data={"config.yaml": CONFIG}
        )
    )
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)

    def held() -> Pod | None:
        for pod in kube.list(
            Pod, namespace=operator_namespace, labels={"app": APP}, fields={"spec.nodeName": host}
        ):
            status = pod.status
            inits = {s.name: s for s in (status.initContainerStatuses if status else None) or []}
            ours = inits.get(INIT)
            if (
                status
                and status.phase == "Pending"
                and ours is not None
                and ours.state is not None
                and ours.state.waiting is not None
                and ours.state.waiting.reason == "CrashLoopBackOff"
            ):
                return pod
        return None

    def daemonset() -> DaemonSet:
        return kube.get(DaemonSet, VALIDATOR, namespace=operator_namespace)

    with roster.running(config, nodes=False, hosts=tmp_path / "hosts", agents=True) as agents:
        operator = start_operator()
        cluster_policies(
            {
                "sandboxWorkloads": {"enabled": True},
                "vgpuManager": {"enabled": False},
                "vgpuDeviceManager": {
                    "enabled": True,
                    "config": {"name": "vgpu-lab", "default": "no-such-config"},
                },
            }
        )
        pod = wait_for(
            "the validator pod held in vgpu-host-state (CrashLoopBackOff)",
            held,
            timeout=90,
            context=operator.log_text,
        )
        assert pod is not None and pod.status is not None
        conditions = {c.type: (c.status, c.reason) for c in pod.status.conditions or []}
        assert conditions["Initialized"] == ("False", "ContainersNotInitialized"), conditions
        assert conditions["Ready"] == ("False", "ContainersNotReady"), conditions
        ours = next(s for s in pod.status.initContainerStatuses or [] if s.name == INIT)
        assert ours.restartCount >= 1 and ours.lastState is not None and ours.lastState.terminated is not None
        assert ours.lastState.terminated.exitCode == 1
        assert [
            s.state.waiting.reason
            for s in pod.status.containerStatuses or []
            if s.state is not None and s.state.waiting is not None
        ] == ["PodInitializing"]
        assert labels(kube, host).get(VGPU_HOST_STATE) == "failed"
        # the DaemonSet controller recounts after the pod's status change reaches it: wait for that
        ds = wait_for(
            "the validator DaemonSet counting the held pod not ready",
            daemonset,
            until=lambda d: (
                d.status is not None and d.status.desiredNumberScheduled == 1 and not d.status.numberReady
            ),
            timeout=60,
            context=operator.log_text,
        )
        assert ds.status is not None and ds.status.currentNumberScheduled == 1, ds.status
        # still held a restart later (kwok does not move it on)
        wait_for(
            "another failed restart",
            held,
            until=lambda p: (
                p is not None
                and p.status is not None
                and next(s for s in p.status.initContainerStatuses or [] if s.name == INIT).restartCount
                > ours.restartCount
            ),
            timeout=60,
            context=operator.log_text,
        )
        kube.patch(Node, host, {"metadata": {"labels": {VGPU_CONFIG: "lab"}}})
        wait_for(
            "the validator DaemonSet ready once the pass goes through",
            daemonset,
            until=lambda d: d.status is not None and d.status.numberReady == 1,
            timeout=90,
            context=operator.log_text,
        )
        assert labels(kube, host).get(VGPU_HOST_STATE) == "restored"
    assert agents.error is None, agents.error
    assert agents.identities is not None and not list(agents.identities.refusals.seen), list(
        agents.identities.refusals.seen
    )
