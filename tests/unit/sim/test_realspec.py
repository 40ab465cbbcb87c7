"""The real node's shape-derived settings, its policy settings and its `nvidia` runtime handler."""

from __future__ import annotations

from pathlib import Path

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.sim.realnode.cudasample import CUDA_SAMPLE_IMAGE
from gpu_operator.sim.realnode.realspec import node_labels, policy_spec


def test_only_operands_whose_image_the_real_node_has_may_select_it() -> None:
    labels = node_labels("host-driver")
    deploy = {k.rsplit(".", 1)[-1]: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")}
    assert "operator-validator" not in deploy and "node-status-exporter" not in deploy
    # the device plugin's stand-in image is imported under NVIDIA's name (sim/realnode/pluginimage.py)
    assert "device-plugin" not in deploy
    assert deploy["driver"] == deploy["gpu-feature-discovery"] == deploy["container-toolkit"] == "false"
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"


def test_policy_spec_points_operands_at_the_host_tree_and_keeps_other_settings() -> None:
    spec = policy_spec(Path("/tmp/host"), {"driver": {"enabled": False}, "validator": {"repository": "r"}})
    parsed = ClusterPolicySpec.model_validate(spec)
    assert parsed.hostPaths.rootFS == "/tmp/host"
    assert parsed.driver.enabled is False and parsed.validator.repository == "r"
    assert parsed.nodeStatusExporter.on()
    assert spec["validator"]["cuda"]["env"] == [{"name": "CUDA_VALIDATOR_IMAGE", "value": CUDA_SAMPLE_IMAGE}]
