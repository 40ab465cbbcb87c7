"""What the probe DaemonSet publishes: node labels and events (pure), and the Node event body."""

from __future__ import annotations

from gpu_operator.node.findings import diagnose
from gpu_operator.node.kubeapi import node_event, pod_detail
from gpu_operator.node.probe import probe
from gpu_operator.node.publish import DRIVER_SOURCE_LABEL, node_events, node_labels


def test_labels_for_a_host_driver_and_a_vfio_host(build_host) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host("ubuntu-apt-driver").fs)
    labels = node_labels(report, diagnose(report))
    assert labels == {
        DRIVER_SOURCE_LABEL: "host",
        "nvidia.com/gpu.driver.version": "550.127.05",
        "nvidia.com/gpu.probe.status": "ok",
    }
    vfio = probe(build_host("h100-vfio").fs)
    labels = node_labels(vfio, diagnose(vfio, "vm-passthrough"))
    assert labels[DRIVER_SOURCE_LABEL] == "vfio" and labels["nvidia.com/gpu.driver.version"] is None


def test_host_driver_on_a_passthrough_node_is_loud(build_host) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host("h100-nvidia-bound").fs)
    findings = diagnose(report, "vm-passthrough")
    assert node_labels(report, findings)["nvidia.com/gpu.probe.status"] == "error"
    events = {e["reason"]: e for e in node_events(findings)}
    event = events["HostDriverOnPassthrough"]
    assert event["type"] == "Warning"
    assert "ERROR:" in event["message"] and "vfio-manage bind --all" in event["message"]
    assert "Evidence: kernel module nvidia is loaded" in event["message"]


def test_info_findings_make_no_events(build_host) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host("talos").fs)
    assert node_events(diagnose(report)) == []


def test_node_event_body() -> None:
    node = {"metadata": {"name": "gpu-0", "uid": "abc"}}
    body = node_event(node, {"reason": "IommuOff", "type": "Warning", "message": "x" * 2000}, "gpu-operator")
    assert body["involvedObject"] == {"kind": "Node", "name": "gpu-0", "uid": "abc", "apiVersion": "v1"}
    assert body["metadata"] == {"generateName": "gpu-0.", "namespace": "gpu-operator"}
    assert len(body["message"]) == 1024 and body["reason"] == "IommuOff"


def test_pod_detail_picks_the_telling_reason() -> None:
    pod = {"status": {"phase": "Pending", "initContainerStatuses": [
        {"name": "cuda-validator-workload", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}}
    assert pod_detail(pod) == "cuda-validator-workload: ImagePullBackOff not found"
