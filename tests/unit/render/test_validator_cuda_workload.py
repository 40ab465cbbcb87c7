"""spec.validator.cuda.env CUDA_WORKLOAD: the validator's cuda container gets the user's choice, names
NVIDIA's CUDA image only where a workload pod would run vectorAdd from it, and an install's image
list (render/images.py, which `gpu-operator images` and the mirror's copy commands read) then names
NVIDIA's operator image only when it is used."""

from __future__ import annotations

from typing import Any

import pytest
from tools.operand_facts.compare import render_policy

from gpu_operator.render.defaults import CUDA_WORKLOAD_IMAGE, OWN_IMAGE
from gpu_operator.render.images import image_uses
from gpu_operator.render.result import RenderError


def _policy(validator: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "cluster-policy"}, "spec": {"validator": validator}}


def _render(validator: dict[str, Any]) -> tuple[dict[str, dict[str, str]], set[str]]:
    """The validator's init containers' env by container, and every image the render's pods use."""
    objects = render_policy(_policy(validator)).objects()
    ds = next(
        o
        for o in objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvidia-operator-validator"
    )
    envs = {
        c["name"]: {e["name"]: e.get("value", "") for e in c.get("env", [])}
        for c in ds["spec"]["template"]["spec"]["initContainers"]
    }
    return envs, {use.image for use in image_uses(objects)}


def test_default_runs_vectoradd_from_nvidias_image() -> None:
    envs, images = _render({})
    assert envs["cuda-validation"]["CUDA_VALIDATOR_IMAGE"] == CUDA_WORKLOAD_IMAGE
    assert CUDA_WORKLOAD_IMAGE in images


def test_driver_api_names_no_cuda_image_and_the_image_list_drops_nvidias() -> None:
    envs, images = _render({"cuda": {"env": [{"name": "CUDA_WORKLOAD", "value": "driver-api"}]}})
    cuda = envs["cuda-validation"]
    assert cuda["CUDA_WORKLOAD"] == "driver-api"
    assert cuda["VALIDATOR_IMAGE"] == OWN_IMAGE  # the workload pod's image then
    assert "CUDA_VALIDATOR_IMAGE" not in cuda and "CUDA_VALIDATOR_IMAGE" not in envs["plugin-validation"]
    assert CUDA_WORKLOAD_IMAGE not in images and OWN_IMAGE in images


def test_a_plugin_workload_the_user_turns_on_still_gets_vectoradds_image() -> None:
    envs, images = _render(
        {
            "cuda": {"env": [{"name": "CUDA_WORKLOAD", "value": "driver-api"}]},
            "plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]},
        }
    )
    assert envs["plugin-validation"]["CUDA_VALIDATOR_IMAGE"] == CUDA_WORKLOAD_IMAGE
    assert "CUDA_VALIDATOR_IMAGE" not in envs["cuda-validation"]
    assert CUDA_WORKLOAD_IMAGE in images


def test_the_cuda_check_without_its_workload_pod_names_no_image() -> None:
    envs, _ = _render({"cuda": {"env": [{"name": "WITH_WORKLOAD", "value": "false"}]}})
    assert "CUDA_VALIDATOR_IMAGE" not in envs["cuda-validation"]


def test_an_unknown_cuda_workload_is_refused_naming_the_field_and_the_values() -> None:
    with pytest.raises(RenderError) as err:
        _render({"cuda": {"env": [{"name": "CUDA_WORKLOAD", "value": "vectoradd"}]}})
    assert err.value.field_path == "spec.validator.cuda.env"
    assert (
        err.value.message == "CUDA_WORKLOAD='vectoradd': use one of vectorAdd, driver-api (default vectorAdd)"
    )
