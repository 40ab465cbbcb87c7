"""What the probe DaemonSet publishes: node labels and events (pure), and the Node event body."""

from __future__ import annotations

from gpu_operator.node.cluster.kubeapi import node_event, pod_detail
from gpu_operator.node.cluster.publish import node_events, node_labels
from gpu_operator.node.doctor.findings import diagnose
from gpu_operator.node.host.probe import probe
from gpu_operator.vocabulary import DRIVER_SOURCE


def test_labels_for_a_host_driver_and_a_vfio_host(build_host) -> None:  # type: ignore[no-untyped-def]
    report = probe(build_host("ubuntu-apt-driver").fs)
    labels = node_labels(report, diagnose(report))
    assert labels == {
        DRIVER_SOURCE: "host",
        "nvidia.com/gpu.driver.version": "550.127.05",
        "nvidia.com/gpu.probe.status": "ok",
    }
    vfio = probe(build_host("h100-vfio").fs)
    labels = node_labels(vfio, diagnose(vfio, "vm-passthrough"))
    assert labels[DRIVER_SOURCE] == "vfio" and labels["nvidia.com/gpu.driver.version"] is None


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
    body = node_event(node, {"reason": "IommuOff", "type": "Warning", "message": "x" * 2000})
    assert body["involvedObject"] == {"kind": "Node", "name": "gpu-0", "uid": "abc", "apiVersion": "v1"}
    assert body["metadata"] == {"generateName": "gpu-0.", "namespace": "default"}
    assert len(body["message"]) == 1024 and body["reason"] == "IommuOff"


def test_pod_detail_picks_the_telling_reason() -> None:
    pod = {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "cuda-validation",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ],
        }
    }
    assert pod_detail(pod) == "cuda-validation: ImagePullBackOff not found"


class FakeNode:
    def __init__(self, labels: dict[str, str], annotations: dict[str, str] | None = None) -> None:
        self.labels = labels
        self.annotations = annotations or {}
        self.published: list[tuple[dict[str, str | None], list[dict[str, str]]]] = []
        self.published_annotations: list[dict[str, str | None]] = []

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        return self.labels, self.annotations

    def publish(
        self,
        labels: dict[str, str | None],
        events: list[dict[str, str]],
        annotations: dict[str, str | None] | None = None,
    ) -> None:
        self.published.append((labels, events))
        self.published_annotations.append(annotations or {})


def test_publish_once_reads_the_workload_label_and_repeats_events_only_on_change(build_host) -> None:  # type: ignore[no-untyped-def]
    from gpu_operator.node.cluster.publish import publish_once

    host = build_host("h100-nvidia-bound")
    node = FakeNode({"nvidia.com/gpu.workload.config": "vm-passthrough"})
    codes, _ = publish_once(host.fs, node)
    codes, _ = publish_once(host.fs, node, last_codes=codes)
    (labels, events), (again, no_events) = node.published
    assert labels["nvidia.com/gpu.probe.status"] == "error" and again == labels
    assert "HostDriverOnPassthrough" in {e["reason"] for e in events} and no_events == []
    container = FakeNode({})
    publish_once(host.fs, container)
    assert container.published[0][0]["nvidia.com/gpu.probe.status"] != "error"


def test_a_node_without_the_label_follows_the_clusters_default_workload(build_host) -> None:  # type: ignore[no-untyped-def]
    """In a cluster whose ClusterPolicy says defaultWorkload: vm-passthrough, an unlabelled node with
    the host's NVIDIA driver is a passthrough node with a host driver on it, not a container node
    missing its runtime; the node's own label still wins."""
    from gpu_operator.node.cluster.publish import publish_once

    host = build_host("h100-nvidia-bound")
    unlabelled = FakeNode({})
    codes, events = publish_once(host.fs, unlabelled, default_workload="vm-passthrough")
    assert "host-driver-on-passthrough" in codes and "nvidia-runtime-missing" not in codes
    assert "HostDriverOnPassthrough" in {e["reason"] for e in events}
    labelled = FakeNode({"nvidia.com/gpu.workload.config": "container"})
    codes, _ = publish_once(host.fs, labelled, default_workload="vm-passthrough")
    assert "host-driver-on-passthrough" not in codes


def test_the_probe_daemonset_passes_the_policys_default_workload() -> None:
    from typer.main import get_command

    from gpu_operator import shapes
    from gpu_operator.api.clusterpolicy import ClusterPolicy
    from gpu_operator.cli import app
    from gpu_operator.render import render
    from gpu_operator.render.clitext import label_gpu_nodes
    from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
    from gpu_operator.render.facts import ClusterFacts

    policy = ClusterPolicy.model_validate(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "p"},
            "spec": {
                "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"},
                "vfioManager": {"enabled": True},
            },
        }
    )
    nodes = shapes.nodes(["vfio-passthrough:1"])
    label_gpu_nodes(nodes)
    result = render(
        policy,
        ClusterFacts.from_nodes(
            nodes, namespace="gpu-operator", k8s_version="1.33.0", operator_env=dict(CHART_DEFAULT_IMAGES)
        ),
    )
    probes = [
        c
        for s in result.states
        for o in s.objects
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"]["containers"]
        if c["name"] == "nvidia-gpu-probe"
    ]
    assert len(probes) == 1
    command = probes[0]["command"]
    assert "--default-workload=vm-passthrough" in command
    # the option is one the CLI accepts
    node = get_command(app).commands["node"]  # type: ignore[attr-defined]
    assert "default_workload" in {p.name for p in node.commands["probe"].params}
