"""The operator with 2 kwok nodes and the real node: our operands really run on the real node,
against its fixture host tree (hostPaths.rootFS), with their own ServiceAccounts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.realnode.realnode import RealNode
from gpu_operator.sim.realnode.realspec import host_spec, policy_spec
from gpu_operator.vocabulary import VALIDATIONS_DIR, VFIO_STATE
from tests.integration.realnode_fixtures import REAL_NODE, api_log
from tests.support.audit import forbidden_in_namespace
from tests.support.events import node_events
from tests.support.status import policy_status
from tests.support.waiting import wait_for

VALIDATOR_APP = "nvidia-operator-validator"
EXPORTER_APP = "nvidia-node-status-exporter"


def _pods(kube: Client, namespace: str, app: str) -> list[dict[str, Any]]:
    return [
        p.to_dict()
        for p in kube.list(Pod, namespace=namespace, labels={"app": app}, fields={"spec.nodeName": REAL_NODE})
    ]


def _summary(kube: Client, namespace: str) -> str:
    pods = kube.list(Pod, namespace=namespace, fields={"spec.nodeName": REAL_NODE})
    return "\n".join(
        f"{p.metadata.name if p.metadata else ''}: {json.dumps(p.to_dict().get('status') or {})[:1500]}"
        for p in pods
    )


def _context(kube: Client, namespace: str, operator: OperatorProcess) -> Callable[[], str]:
    """What a failed wait shows: the real node's pods and the operator's log tail."""
    return lambda: f"{_summary(kube, namespace)}\n--- operator log ---\n{operator.log_text()[-3000:]}"


def _running_with_inits_done(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    inits = status.get("initContainerStatuses") or []
    return (
        status.get("phase") == "Running"
        and bool(inits)
        and all((s.get("state") or {}).get("terminated", {}).get("exitCode") == 0 for s in inits)
    )


def test_operator_ready_with_our_operands_really_running_on_the_real_node(
    control_plane: ControlPlane,
    kube: Client,
    real_gpu_node: RealNode,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    real_node = real_gpu_node
    assert real_node.host_root is not None
    validations = real_node.host_root / VALIDATIONS_DIR.lstrip("/")
    for stale in validations.glob("*"):
        stale.unlink()
    fake_nodes("dgx-h100:2")
    operator = start_operator()
    cluster_policies(policy_spec(real_node.host_root))
    ns = operator_namespace

    context = _context(kube, ns, operator)

    wait_for(
        "the ClusterPolicy to become ready",
        lambda: policy_status(kube).get("state"),
        until=lambda s: s == "ready",
        timeout=300,
        interval=2,
        context=context,
    )
    validator = wait_for(
        "the real node's validator pod with every validation passed",
        lambda: _pods(kube, ns, VALIDATOR_APP),
        timeout=60,
        interval=1,
        context=context,
        until=lambda pods: len(pods) == 1 and _running_with_inits_done(pods[0]),
    )[0]
    name = validator["metadata"]["name"]
    # The init containers really ran: each wrote its status file into the fixture host tree.
    for component in ("driver", "toolkit", "cuda", "plugin"):
        assert (validations / f"{component}-ready").exists(), (component, list(validations.iterdir()))
        assert f"{component}: passed" in "\n".join(
            api_log(control_plane, ns, name, f"{component}-validation")
        )
    assert "IS_HOST_DRIVER=true" in (validations / "driver-ready").read_text()
    assert "nvidia-smi runs inside a GPU container" in "\n".join(
        api_log(control_plane, ns, name, "toolkit-validation")
    )
    # The CUDA validation ran its workload pod for real: the CUDA sample stand-in got both GPUs,
    # the driver's devices and libcuda from the tree through the `nvidia` runtime.
    assert "CUDA workload pod succeeded" in "\n".join(api_log(control_plane, ns, name, "cuda-validation"))
    (workload,) = _pods(kube, ns, "nvidia-cuda-validator")
    assert workload["status"]["phase"] == "Succeeded", workload["status"]
    sample = "\n".join(api_log(control_plane, ns, workload["metadata"]["name"], "cuda-validation"))
    assert "Test PASSED (stand-in: GPUs /dev/nvidia0, /dev/nvidia1)" in sample, sample

    # The node-status exporter's /metrics, scraped from its pod on the node's pod network.
    exporter = wait_for(
        "the real node's node-status exporter pod",
        lambda: _pods(kube, ns, EXPORTER_APP),
        until=lambda pods: (
            len(pods) == 1 and pods[0]["status"].get("podIP") and pods[0]["status"].get("phase") == "Running"
        ),
        timeout=90,
        interval=1,
        context=context,
    )[0]
    url = f"http://{exporter['status']['podIP']}:8000/metrics"
    metrics = wait_for(
        f"metrics from {url}",
        lambda: _scrape(real_node, url),
        until=lambda text: "gpu_operator_node_driver_validation 1.0" in text,
        timeout=60,
        interval=2,
    )
    for line in (
        "gpu_operator_node_driver_ready 1.0",
        "gpu_operator_node_plugin_ready 1.0",
        "gpu_operator_node_device_plugin_devices_total 2.0",
        "gpu_operator_nvidia_pci_devices_total 2.0",
    ):
        assert line in metrics, metrics

    # `gpu-operator status` sees the real node's validation pass.
    shown = _status_command(control_plane, ns)
    assert REAL_NODE in shown and "passed (4/4)" in shown, shown
    assert forbidden_in_namespace(control_plane, ns) == []


def _scrape(node: RealNode, url: str) -> str:
    try:
        return node.http_get(url)
    except Exception as err:  # not listening yet
        return f"not yet: {err}"


def _status_command(plane: ControlPlane, namespace: str) -> str:
    """`gpu-operator status` as a user runs it (wide, so that reasons are not wrapped)."""
    import os

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "status",
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--namespace={namespace}",
        ],
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def _failed_init(kube: Client, namespace: str, container: str) -> str:
    """The termination message of the validator's init container `container` once it failed, or ""."""
    for pod in _pods(kube, namespace, VALIDATOR_APP):
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            last = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if cs["name"] == container and last and last.get("exitCode"):
                return str(last.get("message", ""))
    return ""


def test_a_host_without_driver_keeps_the_real_node_validation_pending_with_a_reason(
    control_plane: ControlPlane,
    kube: Client,
    real_gpu_node: RealNode,
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    real_node = real_gpu_node
    broken = real_node.other_host_roots[0]
    assert not (Path(broken) / "usr/bin/nvidia-smi").exists()
    operator = start_operator()
    spec = policy_spec(broken)
    # A short driver budget, so the validator gives up and says why within the test.
    spec["validator"]["driver"]["env"].append({"name": "DRIVER_TIMEOUT_SECONDS", "value": "10"})
    cluster_policies(spec)
    ns = operator_namespace

    context = _context(kube, ns, operator)

    message = wait_for(
        "the real node's driver validation to fail",
        lambda: _failed_init(kube, ns, "driver-validation"),
        timeout=180,
        interval=2,
        context=context,
    )
    assert "driver:" in message and ".driver-ctr-ready" in message, message
    assert policy_status(kube).get("state") != "ready"
    # The reason, from the validator's termination message (the table may wrap it: compare unwrapped).
    shown = _status_command(control_plane, ns)
    assert REAL_NODE in shown and "driver-validation" in shown, shown
    assert "".join(message.split())[:120] in "".join(shown.split()), shown
    assert forbidden_in_namespace(control_plane, ns) == []


def test_a_cuda_workload_pod_that_gets_no_gpu_fails_the_validation_naming_what_is_missing(
    control_plane: ControlPlane,
    kube: Client,
    real_gpu_node: RealNode,
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    """The validator's workload pods run with a RuntimeClass whose handler is plain runc (a
    misconfigured runtime class): the CUDA sample gets no GPU, and the validation says so."""
    real_node = real_gpu_node
    assert real_node.host_root is not None
    real_node.admin(
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "plain-runc"},
            "handler": "runc",
        },
    )
    try:
        operator = start_operator()
        spec = policy_spec(real_node.host_root)
        spec["validator"]["cuda"]["env"] += [
            {"name": "VALIDATOR_RUNTIME_CLASS", "value": "plain-runc"},
            {"name": "CUDA_TIMEOUT_SECONDS", "value": "60"},
        ]
        cluster_policies(spec)
        ns = operator_namespace

        context = _context(kube, ns, operator)

        message = wait_for(
            "the real node's CUDA validation to fail",
            lambda: _failed_init(kube, ns, "cuda-validation"),
            timeout=240,
            interval=2,
            context=context,
        )
        assert "nvidia-cuda-validator pod" in message and "ended Failed" in message, message
        assert "no CUDA-capable device is detected" in message, message
        assert "/dev/nvidiactl is missing" in message and "no GPU device /dev/nvidiaN" in message, message
        assert policy_status(kube).get("state") != "ready"
    finally:
        real_node.admin("DELETE", "/apis/node.k8s.io/v1/runtimeclasses/plain-runc")


def _shared_group_passthrough_tree(root: Path) -> Path:
    """A vm-passthrough host whose GPUs are on vfio-pci but the first, still on nvidia, shares its
    IOMMU group with a NIC: the vfio manager must refuse to move it."""
    spec = host_spec("vfio-passthrough")
    spec["devices"][0].update(driver="nvidia", iommu_group=10)
    spec["devices"].append(
        {
            "address": "0000:40:00.0",
            "vendor": "8086",
            "device": "1572",
            "class": "020000",
            "driver": "i40e",
            "iommu_group": 10,
        }
    )
    spec["pci_drivers"] = ["vfio-pci", "nvidia", "i40e"]
    spec["modules"] = [*spec["modules"], "nvidia"]
    hosttree.build(spec, root)
    return root


def test_the_vfio_manager_daemonset_refuses_a_shared_iommu_group_on_the_real_node(
    control_plane: ControlPlane,
    kube: Client,
    real_passthrough_node: RealNode,
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
    tmp_path: Path,
) -> None:
    """The operator's vfio-manager DaemonSet (our image: vfio-manage reconcile) really runs on the
    real node against the tree (hostPaths.rootFS): the refusal is in its log, on the Node's label
    (partial: one GPU refused) and in a Warning Event it writes with its own ServiceAccount."""
    assert real_passthrough_node.host_root is not None
    tree = _shared_group_passthrough_tree(tmp_path / "host")
    operator = start_operator()
    cluster_policies(
        policy_spec(tree, {"sandboxWorkloads": {"enabled": True}, "vfioManager": {"enabled": True}})
    )
    ns = operator_namespace

    context = _context(kube, ns, operator)

    def vfio_state() -> str:
        node = kube.get(Node, REAL_NODE)
        return (node.metadata.labels or {}).get(VFIO_STATE, "") if node.metadata else ""

    # the other GPUs are on vfio-pci already and stay there: the node is "partial", not "bound"
    wait_for(
        "the real node's vfio state label",
        vfio_state,
        until=lambda s: s == "partial",
        timeout=240,
        interval=2,
        context=context,
    )
    (pod,) = _pods(kube, ns, "nvidia-vfio-manager")
    log = "\n".join(api_log(control_plane, ns, pod["metadata"]["name"], "nvidia-vfio-manager"))
    assert (
        "vfio state partial" in log
        and "0000:41:00.0: nvidia: REFUSED: IOMMU group 10 also holds non-NVIDIA devices: 0000:40:00.0" in log
    ), log
    events = [e for e in node_events(kube, REAL_NODE) if e.reason == "VFIORefused"]
    assert events and events[-1].type == "Warning" and "0000:40:00.0" in (events[-1].message or ""), events
    assert forbidden_in_namespace(control_plane, ns) == []
