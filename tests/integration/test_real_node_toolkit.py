"""The real node's `nvidia` runtime gives a container what NVIDIA's container toolkit would, and
nothing else: pods of our image on the real node, each container asking differently
(NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES), report what they see; one asking for a GPU
the node does not have is refused with the toolkit's reason."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.sim.hardware import hosttree, migtree
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode import toolkit
from gpu_operator.sim.realnode.realnode import RealNode
from gpu_operator.sim.realnode.realspec import host_spec
from tests.integration.realnode_fixtures import IMAGE, REAL_NODE, SHAPE, api_log, gpus_of
from tests.support import realplugin
from tests.unit.sim.test_deviceplugin_mig import MIG, two_on_gpu0

RUNTIME_CLASS = "nvidia-toolkit-rules"
# What a container sees: each /dev/nvidia* (a character device? what open() says), nvidia-smi's
# first line, the driver libraries in its library directory.
LOOK = """
import errno, glob, json, os, stat, subprocess
seen = {}
for path in sorted(glob.glob('/dev/nvidia*')):
    st = os.stat(path)
    try:
        os.close(os.open(path, os.O_RDWR)); opened = 'ok'
    except OSError as err:
        opened = errno.errorcode.get(err.errno, str(err.errno))
    seen[path] = {'char': stat.S_ISCHR(st.st_mode), 'rdev': [os.major(st.st_rdev), os.minor(st.st_rdev)], 'open': opened}
smi = None
if os.path.exists('/usr/bin/nvidia-smi'):
    smi = subprocess.run(['/usr/bin/nvidia-smi'], capture_output=True, text=True).stdout.splitlines()[:1]
libs = sorted(os.path.basename(p) for p in glob.glob('/usr/lib/x86_64-linux-gnu/lib*nvidia*') + glob.glob('/usr/lib/x86_64-linux-gnu/libcuda*'))
print('SEEN ' + json.dumps({'devices': seen, 'smi': smi, 'libs': libs}))
"""
UUID0 = hosttree.gpu_uuid(host_spec(SHAPE)["devices"][0]["address"])
ASKS: dict[str, dict[str, str] | None] = {
    "all": {"NVIDIA_VISIBLE_DEVICES": "all"},
    "void": {"NVIDIA_VISIBLE_DEVICES": "void"},
    "unset": None,
    "none": {"NVIDIA_VISIBLE_DEVICES": "none"},
    "index1": {"NVIDIA_VISIBLE_DEVICES": "1"},
    "uuid0": {"NVIDIA_VISIBLE_DEVICES": UUID0},
    "utility": {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
}


@pytest.fixture
def runtime_class(real_node: RealNode) -> Iterator[str]:
    """A RuntimeClass of the `nvidia` handler, ours for this test (the operator's `nvidia` is left alone)."""
    real_node.admin(
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": RUNTIME_CLASS},
            "handler": "nvidia",
        },
    )
    yield RUNTIME_CLASS
    real_node.admin("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{RUNTIME_CLASS}")


def _pod(
    plane: ControlPlane, namespace: str, name: str, asks: dict[str, dict[str, str] | None], gpus: int = 0
) -> None:
    """Containers asking as `asks` says; with `gpus`, the first asks the scheduler for that many
    `nvidia.com/gpu` on the real node (else the pod is bound to it directly)."""
    containers: list[dict[str, Any]] = []
    for cname, env in asks.items():
        container: dict[str, Any] = {"name": cname, "image": IMAGE, "command": ["python3.11", "-c", LOOK]}
        if env is not None:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        containers.append(container)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "runtimeClassName": RUNTIME_CLASS,
        "containers": containers,
    }
    if gpus:
        containers[0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        spec["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
    else:
        spec["nodeName"] = REAL_NODE
    plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
    )


def _holding_pod(plane: ControlPlane, namespace: str, name: str, script: str, resource: str) -> None:
    """A pod asking the scheduler for one `resource` on the real node: its container runs `script`
    (which reports what it sees), then stays, holding the device."""
    plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "runtimeClassName": RUNTIME_CLASS,
                "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": IMAGE,
                        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                        "command": ["python3.11", "-c", script + "import time\ntime.sleep(600)\n"],
                        "resources": {"limits": {resource: "1"}},
                    }
                ],
            },
        },
    )


def _wait_reported(plane: ControlPlane, namespace: str, names: tuple[str, ...], prefix: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        pods = [plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{n}") for n in names]
        ended = [p["status"] for p in pods if p["status"].get("phase") in ("Succeeded", "Failed")]
        assert not ended, ended  # e.g. its container refused by the runtime: it never reports
        if all(p["status"].get("phase") == "Running" for p in pods) and all(
            any(line.startswith(prefix) for line in api_log(plane, namespace, n, "main")) for n in names
        ):
            return
        assert time.monotonic() < deadline, [p["status"] for p in pods]
        time.sleep(0.5)


def _unschedulable(plane: ControlPlane, namespace: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod and its PodScheduled condition once the scheduler has found no node for it."""
    deadline = time.monotonic() + 60
    while True:
        pod = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        scheduled = next(
            (c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None
        )
        if scheduled and scheduled["status"] == "False" and scheduled.get("reason") == "Unschedulable":
            return pod, scheduled
        assert time.monotonic() < deadline, pod["status"]
        time.sleep(0.5)


def _statuses(
    plane: ControlPlane, namespace: str, name: str, timeout: float = 120
) -> dict[str, dict[str, Any]]:
    """Each container's state once every one has ended or been refused."""
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        states = {s["name"]: s.get("state", {}) for s in pod["status"].get("containerStatuses") or []}
        ended = all(
            "terminated" in st
            or st.get("waiting", {}).get("reason") in ("CreateContainerError", "RunContainerError")
            for st in states.values()
        )
        if states and ended:
            return states
        assert time.monotonic() < deadline, f"pod {namespace}/{name} still {pod['status']}"
        time.sleep(0.5)


def _seen(plane: ControlPlane, namespace: str, pod: str, container: str) -> dict[str, Any]:
    lines = [line for line in api_log(plane, namespace, pod, container) if line.startswith("SEEN ")]
    assert lines, f"{container}: no report in its log"
    found: dict[str, Any] = json.loads(lines[-1][len("SEEN ") :])
    return found


def gpu_nodes(seen: dict[str, Any]) -> set[str]:
    return {p for p in seen["devices"] if p[len("/dev/nvidia") :].isdigit()}


def test_containers_get_what_they_ask_the_toolkit_for(
    control_plane: ControlPlane, real_node: RealNode, namespace: str, runtime_class: str
) -> None:
    _pod(control_plane, namespace, "asks", ASKS)
    states = _statuses(control_plane, namespace, "asks")
    assert {name: st.get("terminated", {}).get("exitCode") for name, st in states.items()} == dict.fromkeys(
        ASKS, 0
    )
    seen = {name: _seen(control_plane, namespace, "asks", name) for name in ASKS}

    everything = seen["all"]
    assert gpu_nodes(everything) == {"/dev/nvidia0", "/dev/nvidia1"}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(everything["devices"])
    assert "/dev/nvidia-modeset" not in everything["devices"]  # display capability only
    gpu0 = everything["devices"]["/dev/nvidia0"]
    # a character device 195:0 the device cgroup allows: open() reaches the kernel, which has no
    # NVIDIA driver here (ENXIO), not a cgroup refusal (EPERM)
    assert gpu0["char"] and gpu0["rdev"] == [195, 0] and gpu0["open"] == "ENXIO", gpu0
    assert everything["smi"] and "Driver Version" in everything["smi"][0]

    for untouched in ("void", "unset"):
        assert seen[untouched] == {"devices": {}, "smi": None, "libs": []}, untouched
    assert (
        gpu_nodes(seen["none"]) == set()
        and "/dev/nvidiactl" in seen["none"]["devices"]
        and seen["none"]["smi"]
    )
    assert gpu_nodes(seen["index1"]) == {"/dev/nvidia1"}
    assert gpu_nodes(seen["uuid0"]) == {"/dev/nvidia0"}
    assert "/dev/nvidia-uvm" not in seen["utility"]["devices"] and seen["utility"]["smi"]


def test_a_container_asking_for_a_gpu_the_node_lacks_is_refused_with_the_reason(
    control_plane: ControlPlane, real_node: RealNode, namespace: str, runtime_class: str
) -> None:
    _pod(control_plane, namespace, "too-many", {"seven": {"NVIDIA_VISIBLE_DEVICES": "7"}})
    state = _statuses(control_plane, namespace, "too-many")["seven"]
    detail = state.get("terminated") or state.get("waiting") or {}
    assert "unknown device '7'" in detail.get("message", ""), state
    assert f"this node has: 0 ({UUID0})" in detail["message"]
    assert state.get("terminated", {}).get("exitCode") != 0  # never ran


def test_the_kubelet_advertises_the_plugins_gpus_and_a_pod_asking_for_one_gets_exactly_one(
    control_plane: ControlPlane,
    real_node: RealNode,
    namespace: str,
    runtime_class: str,
    device_plugin_pod: RealNode,
) -> None:
    node = control_plane.request("GET", f"/api/v1/nodes/{REAL_NODE}")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    # written by the kubelet from the device plugin's registration, not by anyone's patch: the
    # only manager of the field is the kubelet's status update (our multicall binary's user agent
    # is its name, `kube`, run as `kube kubelet`)
    owners = [
        (m["manager"], m["operation"], m.get("subresource"))
        for m in node["metadata"]["managedFields"]
        if "f:nvidia.com/gpu" in json.dumps(m.get("fieldsV1", {}))
    ]
    assert owners == [("kube", "Update", "status")], owners

    _pod(control_plane, namespace, "one-gpu", {"main": None}, gpus=1)
    state = _statuses(control_plane, namespace, "one-gpu")["main"]
    assert state.get("terminated", {}).get("exitCode") == 0, state
    seen = _seen(control_plane, namespace, "one-gpu", "main")
    # the plugin's Allocate set NVIDIA_VISIBLE_DEVICES to the GPU's UUID; the runtime gave that GPU
    assert len(gpu_nodes(seen)) == 1 and "/dev/nvidiactl" in seen["devices"], seen
    assert seen["smi"], seen


def test_a_pod_asking_for_more_gpus_than_the_node_has_stays_pending_with_the_schedulers_reason(
    control_plane: ControlPlane,
    real_node: RealNode,
    namespace: str,
    runtime_class: str,
    device_plugin_pod: RealNode,
) -> None:
    _pod(control_plane, namespace, "three-gpus", {"main": None}, gpus=3)
    pod, scheduled = _unschedulable(control_plane, namespace, "three-gpus")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert "Insufficient nvidia.com/gpu" in scheduled["message"], scheduled


def test_three_pods_on_two_gpus_time_sliced_two_ways_share_a_gpu(
    control_plane: ControlPlane,
    real_node: RealNode,
    namespace: str,
    runtime_class: str,
    device_plugin_pod: RealNode,
) -> None:
    """The plugin given a time-slicing config (2 replicas) and its SIGHUP, as config-manager does:
    4 allocatable; three pods running at once, each seeing one GPU, two of them the same one."""
    realplugin.configure(
        real_node,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
    )
    try:
        real_node.wait_allocatable("nvidia.com/gpu", "4", 60)
        names = ("share-a", "share-b", "share-c")
        for name in names:  # each reports, then stays: all three hold their replica at once
            _holding_pod(control_plane, namespace, name, LOOK, "nvidia.com/gpu")
        _wait_reported(control_plane, namespace, names, "SEEN ")
        seen = [gpu_nodes(_seen(control_plane, namespace, n, "main")) for n in names]
        assert all(len(s) == 1 for s in seen), seen
        assert len({next(iter(s)) for s in seen}) < 3, seen  # 3 pods, 2 GPUs: two share one
    finally:
        for name in ("share-a", "share-b", "share-c"):
            with contextlib.suppress(Exception):
                control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        realplugin.configure(real_node, "")
        real_node.wait_allocatable("nvidia.com/gpu", "2", 60)


# What a container holding a MIG device sees: the GPU and MIG cap device nodes (their numbers) and
# the device list the plugin's Allocate gave it.
MIG_LOOK = """
import glob, json, os
nodes = sorted(p for p in glob.glob('/dev/nvidia*') + glob.glob('/dev/nvidia-caps/*') if not os.path.isdir(p))
seen = {p: [os.major(os.stat(p).st_rdev), os.minor(os.stat(p).st_rdev)] for p in nodes}
print('MIG ' + json.dumps({'devices': seen, 'visible': os.environ.get('NVIDIA_VISIBLE_DEVICES')}))
"""


def _mig_seen(plane: ControlPlane, namespace: str, pod: str) -> dict[str, Any]:
    lines = [line for line in api_log(plane, namespace, pod, "main") if line.startswith("MIG ")]
    assert lines, f"{pod}: no report in its log"
    found: dict[str, Any] = json.loads(lines[-1][len("MIG ") :])
    return found


def test_three_pods_asking_for_a_mig_device_two_get_one_each_the_third_stays_pending(
    control_plane: ControlPlane,
    real_node: RealNode,
    namespace: str,
    runtime_class: str,
    device_plugin_pod: RealNode,
    tmp_path: Path,
) -> None:
    """The node's GPUs for this test: a DGX H100 tree with two 1g.10gb MIG devices on GPU 0 (as the
    MIG manager leaves it), its device plugin under the mixed strategy: `nvidia.com/mig-1g.10gb` 2
    allocatable; two pods asking for one each get a different one (the parent GPU's node and exactly
    that device's cap nodes, NVIDIA_VISIBLE_DEVICES its MIG UUID), a third stays Pending."""
    tree = two_on_gpu0(tmp_path / "h100" / "root")
    state = migtree.tree_state(tree)
    assert state is not None
    parent = state[0]
    minor = {g.index: g.minor for g in toolkit.gpus(tree)}[parent.index]
    caps = {
        parent.mig_uuid(inst): {p: [migtree.CAPS_MAJOR, m] for p, m in migtree.access_nodes(minor, inst)}
        for inst in parent.instances
    }
    names = ("mig-a", "mig-b", "mig-c")
    with gpus_of(real_node, tree, "mixed"):
        try:
            real_node.wait_allocatable(MIG, "2", 60)
            real_node.wait_allocatable("nvidia.com/gpu", "7", 60)  # the 7 GPUs with MIG off
            for name in names[:2]:
                _holding_pod(control_plane, namespace, name, MIG_LOOK, MIG)
            _wait_reported(control_plane, namespace, names[:2], "MIG ")
            _holding_pod(control_plane, namespace, names[2], MIG_LOOK, MIG)
            pod, scheduled = _unschedulable(control_plane, namespace, names[2])
            assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
            # "0/N nodes are available: 1 Insufficient <resource>, M node(s) didn't match ... preemption: ..."
            reasons = {
                r.split(" ", 1)[1] for r in scheduled["message"].split(": ", 1)[1].split(". ")[0].split(", ")
            }
            assert f"Insufficient {MIG}" in reasons, scheduled

            seen = [_mig_seen(control_plane, namespace, n) for n in names[:2]]
            assert {s["visible"] for s in seen} == set(caps), seen  # one MIG device each, not the same one
            for one in seen:
                devices = one["devices"]
                assert gpu_nodes(one) == {f"/dev/nvidia{minor}"} and devices[f"/dev/nvidia{minor}"] == [
                    195,
                    minor,
                ], one
                assert {p: v for p, v in devices.items() if p.startswith("/dev/nvidia-caps/")} == caps[
                    one["visible"]
                ], one
                assert "/dev/nvidiactl" in devices, one
        finally:
            for name in names:
                with contextlib.suppress(Exception):
                    control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    # the node's own GPUs again (gpus_of waited for them): no MIG device left to allocate
    real_node.wait_allocatable(MIG, "0", 60)
    assert (
        real_node.admin("GET", f"/api/v1/nodes/{REAL_NODE}")["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    )
