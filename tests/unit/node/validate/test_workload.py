"""cuda and plugin validations: the pod manifests (pure) and the flow against a fake node view."""

from __future__ import annotations

from typing import get_args

import kubernetes_validate
import pytest

from gpu_operator.node.cluster.kubeapi import pod_detail
from gpu_operator.node.validate.base import Outcome, PodOutcome, ValidationFailed
from gpu_operator.node.validate.config import ValidatorConfig, ValidatorConfigError
from gpu_operator.node.validate.run import validate
from gpu_operator.node.validate.workload import CUDA_APP, PLUGIN_APP, pick_gpu_resource, workload_pod
from gpu_operator.vocabulary import CUDA_WORKLOADS
from tests.unit.node.nodekit import FakeNodeView, context

TEMPLATE = {
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-operator-validator", "uid": "u1"}
    ],
}


def test_cuda_pod_manifest_is_pinned_owned_and_valid() -> None:
    pod = workload_pod(
        CUDA_APP,
        node_name="gpu-0",
        namespace="gpu-operator",
        image="example/cuda:1",
        template=TEMPLATE,
        runtime_class="nvidia",
        pull_secrets=("regcred",),
        pull_policy="IfNotPresent",
    )
    assert pod["metadata"]["generateName"] == "nvidia-cuda-validator-"
    assert pod["metadata"]["labels"]["app"] == "nvidia-cuda-validator"
    assert pod["metadata"]["ownerReferences"] == TEMPLATE["ownerReferences"]
    assert pod["spec"]["nodeName"] == "gpu-0" and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["tolerations"] == TEMPLATE["tolerations"]
    assert pod["spec"]["runtimeClassName"] == "nvidia" and pod["spec"]["imagePullSecrets"] == [
        {"name": "regcred"}
    ]
    assert pod["spec"]["initContainers"][0]["command"] == ["vectorAdd"]
    assert {c["imagePullPolicy"] for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]} == {
        "IfNotPresent"
    }
    # the NVIDIA runtime injects every GPU only when asked (the validator image says void)
    init = pod["spec"]["initContainers"][0]
    assert init["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert init["securityContext"]["privileged"] is True
    assert pod["spec"]["containers"][0]["securityContext"]["privileged"] is True
    named = {**pod, "metadata": {**pod["metadata"], "name": "nvidia-cuda-validator-x"}}
    kubernetes_validate.validate(named, "1.33", strict=True)


def test_plugin_pod_requests_one_gpu() -> None:
    pod = workload_pod(
        PLUGIN_APP,
        node_name="n",
        namespace="ns",
        image="i",
        template={},
        gpu_resource="nvidia.com/mig-1g.10gb",
    )
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


@pytest.mark.parametrize(
    ("allocatable", "override", "expected"),
    [
        ({"nvidia.com/gpu": "8", "cpu": "64"}, "", "nvidia.com/gpu"),
        ({"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}, "", "nvidia.com/mig-1g.10gb"),
        ({"nvidia.com/gpu": "0"}, "", None),
        ({"nvidia.com/gpu.shared": "16"}, "", "nvidia.com/gpu.shared"),
        ({"nvidia.com/gpu": "2", "example.com/vgpu": "4"}, "example.com/vgpu", "example.com/vgpu"),
        ({"nvidia.com/gpu": "bad"}, "", None),
    ],
)
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
    view = FakeNodeView(
        outcome=PodOutcome(False, "Failed", "cuda-validation: Error CUDA driver version is insufficient")
    )
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
    ctx, clock = context(
        host.fs, {**ENV, "WITH_WORKLOAD": "false"}, kube=FakeNodeView(allocatable={"cpu": "64"})
    )
    result = validate(ctx, "plugin")
    assert result.outcome == Outcome.FAILED and clock.now == 150  # upstream's 30 x 5 s
    assert "status.allocatable" in result.message and "nvidia-device-plugin-daemonset" in result.message
    view = FakeNodeView(allocatable={"nvidia.com/gpu": "2"})
    ctx, _ = context(host.fs, ENV, kube=view)
    assert validate(ctx, "plugin").outcome == Outcome.PASSED
    assert view.pods[0]["spec"]["initContainers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


# CUDA_WORKLOAD=driver-api: the workload pod runs our `gpu-operator node cuda-check` in the validator's image
DRIVER_API = {**ENV, "VALIDATOR_IMAGE": "example/gpu-operator:1", "CUDA_WORKLOAD": "driver-api"}


def test_driver_api_runs_our_check_in_the_validator_image(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    view = FakeNodeView()
    ctx, _ = context(host.fs, DRIVER_API, kube=view)
    result = validate(ctx, "cuda")
    assert (
        result.outcome == Outcome.PASSED
        and result.message == "CUDA workload pod succeeded (CUDA_WORKLOAD=driver-api)"
    )
    (pod,) = view.pods
    (init,) = pod["spec"]["initContainers"]
    assert (
        init["image"] == pod["spec"]["containers"][0]["image"] == "example/gpu-operator:1"
    )  # not CUDA_VALIDATOR_IMAGE
    assert init["command"] == ["gpu-operator", "node", "cuda-check"]
    # as for vectorAdd: every GPU through the NVIDIA runtime (and CDI), the check's last line as the message
    assert init["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert pod["metadata"]["annotations"] == {
        "nvidia.cdi.k8s.io/container.cuda-validation": "management.nvidia.com/gpu=all"
    }
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    meta = {k: v for k, v in pod["metadata"].items() if k != "ownerReferences"}  # the fake's are partial
    kubernetes_validate.validate({**pod, "metadata": {**meta, "name": "x"}}, "1.33", strict=True)
    # the default stays NVIDIA's sample, from CUDA_VALIDATOR_IMAGE
    view = FakeNodeView()
    ctx, _ = context(host.fs, {**DRIVER_API, "CUDA_WORKLOAD": ""}, kube=view)
    assert validate(ctx, "cuda").message == "CUDA workload pod succeeded (CUDA_WORKLOAD=vectorAdd)"
    assert view.pods[0]["spec"]["initContainers"][0]["command"] == ["vectorAdd"]
    assert view.pods[0]["spec"]["initContainers"][0]["image"] == "example/cuda:1"


def test_driver_api_failure_quotes_the_checks_last_line(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    last = (
        "cuda-check: FAILED: cuInit returned CUDA_ERROR_NO_DEVICE (100). Likely fix: the container was given no "
        "GPU device node (missing /dev/nvidiaN)"
    )
    # the pod as the kubelet reports it: the init container's termination message is its log's tail
    pod = {
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {
                    "name": "cuda-validation",
                    "state": {
                        "terminated": {
                            "reason": "Error",
                            "exitCode": 1,
                            "message": f"cuda-check: device nodes: none\n{last}\n",
                        }
                    },
                }
            ],
        }
    }
    view = FakeNodeView(outcome=PodOutcome(False, "Failed", pod_detail(pod)))
    ctx, _ = context(host.fs, DRIVER_API, kube=view)
    result = validate(ctx, "cuda")
    assert result.outcome == Outcome.FAILED
    assert last in result.message and "nvidia-cuda-validator pod on node gpu-0 ended Failed" in result.message
    assert result.message.endswith(
        "an image pull error needs VALIDATOR_IMAGE/pull secrets, a CUDA error the pod's "
        "last line names the CUDA error and a likely fix (`gpu-operator node cuda-check`)"
    )


def test_driver_api_needs_the_validator_image_and_a_known_workload(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    ctx, _ = context(
        host.fs,
        {**DRIVER_API, "VALIDATOR_IMAGE": "", "CUDA_VALIDATOR_IMAGE": "example/cuda:1"},
        kube=FakeNodeView(),
    )
    result = validate(ctx, "cuda")
    assert result.outcome == Outcome.FAILED
    assert "no workload image: set VALIDATOR_IMAGE (an image with gpu-operator)" in result.message
    with pytest.raises(ValidatorConfigError) as err:
        ValidatorConfig.from_env({**DRIVER_API, "CUDA_WORKLOAD": "vectoradd"})
    assert str(err.value) == "CUDA_WORKLOAD='vectoradd': use one of 'vectorAdd' or 'driver-api'"
    assert get_args(ValidatorConfig.model_fields["cuda_workload"].annotation) == CUDA_WORKLOADS


def test_a_plugin_workload_with_driver_api_asks_for_one_gpu(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    view = FakeNodeView(allocatable={"nvidia.com/gpu": "2"})
    ctx, _ = context(host.fs, DRIVER_API, kube=view)
    assert validate(ctx, "plugin").outcome == Outcome.PASSED
    (init,) = view.pods[0]["spec"]["initContainers"]
    assert (
        init["command"] == ["gpu-operator", "node", "cuda-check"]
        and init["image"] == "example/gpu-operator:1"
    )
    assert init["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
