"""cuda and plugin validations: the pod manifests (pure) and the flow against a fake node view."""

from __future__ import annotations

import kubernetes_validate
import pytest

from gpu_operator.node.validate.base import Outcome, PodOutcome, ValidationFailed
from gpu_operator.node.validate.run import validate
from gpu_operator.node.validate.workload import CUDA_APP, PLUGIN_APP, pick_gpu_resource, workload_pod
from tests.unit.node.nodekit import FakeNodeView, context

TEMPLATE = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-operator-validator", "uid": "u1"}]}


def test_cuda_pod_manifest_is_pinned_owned_and_valid() -> None:
    pod = workload_pod(CUDA_APP, node_name="gpu-0", namespace="gpu-operator", image="example/cuda:1", template=TEMPLATE,
                       runtime_class="nvidia", pull_secrets=("regcred",), pull_policy="IfNotPresent")
    assert pod["metadata"]["generateName"] == "nvidia-cuda-validator-"
    assert pod["metadata"]["labels"]["app"] == "nvidia-cuda-validator"
    assert pod["metadata"]["ownerReferences"] == TEMPLATE["ownerReferences"]
    assert pod["spec"]["nodeName"] == "gpu-0" and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["tolerations"] == TEMPLATE["tolerations"]
    assert pod["spec"]["runtimeClassName"] == "nvidia" and pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["initContainers"][0]["command"] == ["vectorAdd"]
    assert {c["imagePullPolicy"] for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]} == {"IfNotPresent"}
    # the NVIDIA runtime injects every GPU only when asked (the validator image says void)
    init = pod["spec"]["initContainers"][0]
    assert init["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert init["securityContext"]["privileged"] is True
    assert pod["spec"]["containers"][0]["securityContext"]["privileged"] is True
    named = {**pod, "metadata": {**pod["metadata"], "name": "nvidia-cuda-validator-x"}}
    kubernetes_validate.validate(named, "1.33", strict=True)


def test_plugin_pod_requests_one_gpu() -> None:
    pod = workload_pod(PLUGIN_APP, node_name="n", namespace="ns", image="i", template={}, gpu_resource="nvidia.com/mig-1g.10gb")
    assert pod["spec"]["initContainers"][0]["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    # the device plugin picks the GPU: no blanket NVIDIA_VISIBLE_DEVICES, not privileged
    assert "env" not in pod["spec"]["initContainers"][0]
    assert not pod["spec"]["initContainers"][0]["securityContext"].get("privileged")
    assert "ownerReferences" not in pod["metadata"]


def test_manifest_refuses_missing_image_or_node() -> None:
    with pytest.raises(ValidationFailed, match="CUDA_VALIDATOR_IMAGE"):
        workload_pod(CUDA_APP, node_name="n", namespace="ns", image="", template={})
    with pytest.raises(ValidationFailed, match="NODE_NAME"):
        workload_pod(CUDA_APP, node_name="", namespace="ns", image="i", template={})


@pytest.mark.parametrize(("allocatable", "override", "expected"), [
    ({"nvidia.com/gpu": "8", "cpu": "64"}, "", "nvidia.com/gpu"),
    ({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}, "", "nvidia.com/mig-1g.10gb"),
    ({"nvidia.com/gpu": "0"}, "", None),
    ({"nvidia.com/gpu.shared": "16"}, "", "nvidia.com/gpu.shared"),
    ({"nvidia.com/gpu": "2", "example.com/vgpu": "4"}, "example.com/vgpu", "example.com/vgpu"),
    ({"nvidia.com/gpu": "bad"}, "", None),
])
def test_pick_gpu_resource(allocatable: dict[str, str], override: str, expected: str | None) -> None:
    assert pick_gpu_resource(allocatable, override) == expected


ENV = {"NODE_NAME": "gpu-0", "OPERATOR_NAMESPACE": "gpu-operator", "CUDA_VALIDATOR_IMAGE": "example/cuda:1"}


def test_cuda_runs_the_pod_and_writes_cuda_ready(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    view = FakeNodeView()
    ctx, _ = context(host.fs, ENV, kube=view)
    assert validate(ctx, "cuda").outcome == Outcome.PASSED
    assert [p["metadata"]["labels"]["app"] for p in view.pods] == ["nvidia-cuda-validator"]
    assert host.fs.read_text("/run/nvidia/validations/cuda-ready") == ""


def test_cuda_failure_carries_the_pod_reason(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    view = FakeNodeView(outcome=PodOutcome(False, "Failed", "cuda-validation: Error CUDA driver version is insufficient"))
    ctx, _ = context(host.fs, ENV, kube=view)
    result = validate(ctx, "cuda")
    assert result.outcome == Outcome.FAILED and "insufficient" in result.message and "gpu-0" in result.message
    assert host.fs.read_text("/run/nvidia/validations/cuda-ready") is None


def test_cuda_without_api_access_says_how_to_proceed(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    ctx, _ = context(host.fs, ENV)
    result = validate(ctx, "cuda")
    assert result.outcome == Outcome.FAILED and "WITH_WORKLOAD=false" in result.message
    ctx, _ = context(host.fs, {**ENV, "WITH_WORKLOAD": "false"})
    assert validate(ctx, "cuda").outcome == Outcome.PASSED


def test_plugin_waits_for_capacity_within_its_budget(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    ctx, clock = context(host.fs, {**ENV, "WITH_WORKLOAD": "false"}, kube=FakeNodeView(allocatable={"cpu": "64"}))
    result = validate(ctx, "plugin")
    assert result.outcome == Outcome.FAILED and clock.now == 150  # upstream's 30 x 5 s
    assert "status.allocatable" in result.message and "nvidia-device-plugin-daemonset" in result.message
    view = FakeNodeView(allocatable={"nvidia.com/gpu": "2"})
    ctx, _ = context(host.fs, ENV, kube=view)
    assert validate(ctx, "plugin").outcome == Outcome.PASSED
    assert view.pods[0]["spec"]["initContainers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
