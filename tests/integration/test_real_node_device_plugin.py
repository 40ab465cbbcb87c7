"""The device plugin on the real node lives and dies with the operator's pod: its stand-in's image
under NVIDIA's name (sim/realnode/pluginimage.py) is run by the operator's DaemonSet, so the node's
`nvidia.com/gpu` is registered while that pod runs and only then, and the validator's plugin check
passes against the plugin the operator deployed, not one the simulator started on its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.realnode.realnode import RealNode
from gpu_operator.sim.realnode.realspec import policy_spec
from gpu_operator.vocabulary import VALIDATIONS_DIR, deploy_label
from tests.integration.realnode_fixtures import MERGE, REAL_NODE
from tests.integration.test_real_node_operator import VALIDATOR_APP, _context, _pods
from tests.support import realplugin
from tests.support.waiting import wait_for

GPU = "nvidia.com/gpu"
PLUGIN_APP = "nvidia-device-plugin-daemonset"
PLUGIN_LABEL = deploy_label("device-plugin")


def _label(node: RealNode, value: str) -> None:
    node.admin("PATCH", f"/api/v1/nodes/{REAL_NODE}", {"metadata": {"labels": {PLUGIN_LABEL: value}}}, MERGE)


def _allocatable(node: RealNode) -> str | None:
    value: str | None = (
        node.admin("GET", f"/api/v1/nodes/{REAL_NODE}")["status"].get("allocatable", {}).get(GPU)
    )
    return value


def _heartbeat(node: RealNode) -> str:
    """The time of the kubelet's last node status report (its Ready condition's heartbeat)."""
    conditions = node.admin("GET", f"/api/v1/nodes/{REAL_NODE}")["status"]["conditions"]
    return str(next(c["lastHeartbeatTime"] for c in conditions if c["type"] == "Ready"))


def _init_state(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status["name"] == name:
            state: dict[str, Any] = status.get("state") or {}
            return state
    return {}


def _validator(kube: Client, ns: str) -> dict[str, Any]:
    pods = _pods(kube, ns, VALIDATOR_APP)
    return pods[0] if len(pods) == 1 else {}


def _plugin_pods(kube: Client, ns: str) -> list[dict[str, Any]]:
    return [p for p in _pods(kube, ns, PLUGIN_APP) if not p["metadata"].get("deletionTimestamp")]


def _served_by(node: RealNode, uid: str) -> bool:
    """The stand-in's one process runs in pod `uid`'s cgroup (the kubelet names it pod<uid>)."""
    pids = realplugin.plugin_pids(node)
    return len(pids) == 1 and uid.replace("-", "_") in Path(f"/proc/{pids[0]}/cgroup").read_text().replace(
        "-", "_"
    )


def test_the_plugin_serves_the_nodes_gpus_only_while_the_operators_pod_runs(
    kube: Client,
    real_gpu_node: RealNode,
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    node = real_gpu_node
    assert node.host_root is not None
    validations = node.host_root / VALIDATIONS_DIR.lstrip("/")
    for stale in validations.glob("*"):
        stale.unlink()
    # No device-plugin pod: its deploy label false on the node (the operator keeps a value it finds).
    _label(node, "false")
    operator = start_operator()
    cluster_policies(policy_spec(node.host_root))
    ns = operator_namespace
    context = _context(kube, ns, operator)

    # The validator gets to its plugin check, which finds nothing to pass on.
    started = wait_for(
        "the validator's plugin check to run",
        lambda: _init_state(_validator(kube, ns), "plugin-validation"),
        until=lambda s: "running" in s,
        timeout=240,
        interval=1,
        context=context,
    )["running"]["startedAt"]
    wait_for(
        "a node status report after the plugin check started",
        lambda: _heartbeat(node),
        until=lambda beat: beat > started,
        timeout=60,
        interval=1,
    )
    assert _plugin_pods(kube, ns) == [] and realplugin.plugin_pids(node) == []
    assert _allocatable(node) in (None, "0")
    assert "running" in _init_state(_validator(kube, ns), "plugin-validation")
    assert not (validations / "plugin-ready").exists()

    # The pod runs: the plugin registers through the pod's socket directory, the check passes.
    _label(node, "true")
    (pod,) = wait_for(
        "the device plugin's pod running on the real node",
        lambda: _plugin_pods(kube, ns),
        until=lambda pods: len(pods) == 1 and pods[0]["status"].get("phase") == "Running",
        timeout=120,
        interval=1,
        context=context,
    )
    wait_for(
        "2 GPUs allocatable", lambda: _allocatable(node), until=lambda v: v == "2", timeout=60, interval=0.5
    )
    assert _served_by(node, pod["metadata"]["uid"])
    wait_for(
        "the validator's plugin check to pass",
        lambda: _init_state(_validator(kube, ns), "plugin-validation"),
        until=lambda s: s.get("terminated", {}).get("exitCode") == 0,
        timeout=90,
        interval=1,
        context=context,
    )
    assert (validations / "plugin-ready").exists()

    # The pod deleted: the DaemonSet's new pod serves the GPUs, from its own process.
    kube.delete(Pod, pod["metadata"]["name"], namespace=ns)
    (new,) = wait_for(
        "the DaemonSet's new device plugin pod",
        lambda: _plugin_pods(kube, ns),
        until=lambda pods: (
            len(pods) == 1
            and pods[0]["metadata"]["uid"] != pod["metadata"]["uid"]
            and pods[0]["status"].get("phase") == "Running"
        ),
        timeout=120,
        interval=1,
        context=context,
    )
    wait_for(
        "the new pod's plugin serving",
        lambda: _served_by(node, new["metadata"]["uid"]),
        timeout=60,
        interval=0.5,
    )
    wait_for(
        "2 GPUs allocatable again",
        lambda: _allocatable(node),
        until=lambda v: v == "2",
        timeout=60,
        interval=0.5,
    )

    # The pod gone for good (its deploy label false, as an upgrade or a reset pauses it): so are the GPUs.
    _label(node, "false")
    wait_for(
        "the device plugin's pod gone",
        lambda: _pods(kube, ns, PLUGIN_APP),
        until=lambda pods: pods == [],
        timeout=90,
        interval=1,
        context=context,
    )
    assert realplugin.plugin_pids(node) == []
    wait_for(
        "no GPU allocatable",
        lambda: _allocatable(node),
        until=lambda v: v in (None, "0"),
        timeout=60,
        interval=0.5,
    )
