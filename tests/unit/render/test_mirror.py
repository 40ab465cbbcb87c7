"""The mirror rule (render/mirror.py) and the image collection (render/images.py), as tables."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.render.defaults import CUDA_WORKLOAD_IMAGE
from gpu_operator.render.images import image_uses
from gpu_operator.render.mirror import (
    MirrorError,
    Reference,
    check_mirror,
    check_targets,
    copy_commands,
    mirror_values,
    mirrored,
    mirrored_repository,
)

M = "mirror.example.com:5000/gpu"
DIGEST = "sha256:" + "0f" * 32


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("nvcr.io/nvidia/k8s-device-plugin:v0.20.0", ("nvcr.io", "nvidia/k8s-device-plugin", "v0.20.0", "")),
        (f"nvcr.io/nvidia/driver@{DIGEST}", ("nvcr.io", "nvidia/driver", "", DIGEST)),
        ("localhost:5000/x/y:1", ("localhost:5000", "x/y", "1", "")),
        ("busybox:1.36", ("docker.io", "library/busybox", "1.36", "")),
        ("nvidia/cuda", ("docker.io", "nvidia/cuda", "", "")),
        ("registry:5000/a", ("registry:5000", "a", "", "")),
    ],
)
def test_a_reference_splits_as_docker_splits_it(ref: str, parts: tuple[str, str, str, str]) -> None:
    assert Reference.parse(ref) == Reference(*parts)


@pytest.mark.parametrize(
    ("ref", "target"),
    [
        ("nvcr.io/nvidia/k8s-device-plugin:v0.20.0", f"{M}/nvidia/k8s-device-plugin:v0.20.0"),
        (f"nvcr.io/nvidia/driver@{DIGEST}", f"{M}/nvidia/driver@{DIGEST}"),
        ("ghcr.io/gpu-operator-py/gpu-operator:0.1.0", f"{M}/gpu-operator-py/gpu-operator:0.1.0"),
        ("busybox:1.36", f"{M}/library/busybox:1.36"),
        (f"{M}/nvidia/x:1", f"{M}/nvidia/x:1"),  # already there
    ],
)
def test_the_host_is_replaced_and_the_path_and_tag_kept(ref: str, target: str) -> None:
    assert mirrored(ref, M) == target


@pytest.mark.parametrize(
    "repository", ["nvcr.io/nvidia", "nvcr.io/nvidia/cloud-native", "nvidia", "registry:5000/a"]
)
def test_a_repository_moves_as_its_images_do(repository: str) -> None:
    assert f"{mirrored_repository(repository, M)}/img:1" == mirrored(f"{repository}/img:1", M)


@pytest.mark.parametrize(
    "bad", ["https://registry.example.com", "registry.example.com/gpu:v1", "", "justaname", "myregistry/gpu"]
)
def test_a_mirror_that_is_no_registry_is_refused(bad: str) -> None:
    with pytest.raises(MirrorError, match="--mirror"):
        check_mirror(bad)


@pytest.mark.parametrize("good", ["registry:5000", "localhost/gpu", "registry.example.com/a/b"])
def test_a_registry_with_a_path_is_a_mirror(good: str) -> None:
    assert check_mirror(good + "/") == good


def test_two_registries_with_one_path_are_refused() -> None:
    with pytest.raises(MirrorError, match="same path in two registries"):
        check_targets(["nvcr.io/nvidia/x:1", "docker.io/nvidia/x:1"], M)
    assert check_targets(["nvidia/x:1", "docker.io/nvidia/x:1"], M)  # one image, spelled twice


def test_copy_commands_keep_digests_and_every_architecture() -> None:
    assert copy_commands([f"nvcr.io/nvidia/driver@{DIGEST}", "busybox:1", f"{M}/already/there:1"], M) == [
        f"skopeo copy --all --preserve-digests docker://docker.io/library/busybox:1 docker://{M}/library/busybox:1",
        f"skopeo copy --all --preserve-digests docker://nvcr.io/nvidia/driver@{DIGEST} docker://{M}/nvidia/driver@{DIGEST}",
    ]


def test_mirror_values_use_the_charts_keys() -> None:
    values: dict[str, Any] = {
        "operator": {
            "repository": "ghcr.io/gpu-operator-py",
            "image": "gpu-operator",
            "env": [{"name": "LOG", "value": "x"}],
        },
        "validator": {
            "repository": "nvcr.io/nvidia",
            "image": "gpu-operator",
            "version": "v26.7.0",
            "cuda": {
                "env": [
                    {"name": "CUDA_VALIDATOR_IMAGE", "value": "nvcr.io/nvidia/cuda:12"},
                    {"name": "OTHER", "value": "nvcr.io/not/an-image-var:1"},
                ]
            },
        },
        "driver": {
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": "595",
            "manager": {"repository": "nvcr.io/nvidia/cloud-native", "image": "k8s-driver-manager"},
        },
        "vgpuManager": {
            "repository": "",
            "image": "vgpu-manager",
            "version": "",
        },  # a bare name: nothing to pull
        "custom": {"repository": "", "image": "quay.io/x/y:1"},
        "driverless": {"enabled": True},
    }
    out = mirror_values(values, M, f"ghcr.io/gpu-operator-py/gpu-operator@{DIGEST}", {"DRIVER_IMAGE": "x"})
    assert out == {
        "operator": {
            "repository": f"{M}/gpu-operator-py",
            "env": [
                {"name": "LOG", "value": "x"},
                {"name": "CUDA_VALIDATOR_IMAGE", "value": mirrored(CUDA_WORKLOAD_IMAGE, M)},
            ],
        },
        # NVIDIA's operator image, which the chart swaps for ours: ours, in the mirror, version included
        "validator": {
            "repository": f"{M}/gpu-operator-py",
            "image": "gpu-operator",
            "version": DIGEST,
            "cuda": {
                "env": [
                    {"name": "CUDA_VALIDATOR_IMAGE", "value": f"{M}/nvidia/cuda:12"},
                    {"name": "OTHER", "value": "nvcr.io/not/an-image-var:1"},
                ]
            },
        },
        "driver": {"repository": f"{M}/nvidia", "manager": {"repository": f"{M}/nvidia/cloud-native"}},
        "custom": {"image": f"{M}/x/y:1"},
    }
    # the operator already has the CUDA image variable: no second one
    given = mirror_values({}, M, "ghcr.io/a/b:1", {"CUDA_VALIDATOR_IMAGE": "nvcr.io/c/d:1"})
    assert given == {}


def test_images_come_from_containers_and_image_variables_but_not_the_operators_fallbacks() -> None:
    def pod(*containers: dict[str, Any]) -> dict[str, Any]:
        return {"template": {"spec": {"initContainers": [containers[0]], "containers": list(containers[1:])}}}

    operator = {
        "kind": "Deployment",
        "metadata": {"name": "gpu-operator", "namespace": "ns"},
        "spec": pod(
            {"name": "init", "image": "r.io/a/init:1"},
            {
                "name": "op",
                "image": "r.io/a/op:1",
                "command": ["gpu-operator", "run"],
                "env": [{"name": "DRIVER_IMAGE", "value": "r.io/a/driver:1"}],
            },
        ),
    }
    operand = {
        "kind": "CronJob",
        "metadata": {"name": "job"},
        "spec": {
            "jobTemplate": {
                "spec": pod(
                    {"name": "i", "image": "r.io/a/i:1"},
                    {
                        "name": "c",
                        "image": "r.io/a/c:1",
                        "env": [
                            {"name": "VALIDATOR_IMAGE", "value": "r.io/a/v:1"},
                            {"name": "IMAGE_NAME", "value": "r.io/a/n:1"},
                            {"name": "VALIDATOR_IMAGE_PULL_POLICY", "value": "Always"},
                            {"name": "FROM", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                        ],
                    },
                )
            }
        },
    }
    uses = image_uses([operator, operand])
    assert sorted((u.image, u.where()) for u in uses) == [
        ("r.io/a/c:1", "CronJob/job c"),
        ("r.io/a/i:1", "CronJob/job i"),
        ("r.io/a/init:1", "Deployment/ns/gpu-operator init"),
        ("r.io/a/n:1", "CronJob/job c env IMAGE_NAME"),
        ("r.io/a/op:1", "Deployment/ns/gpu-operator op"),
        ("r.io/a/v:1", "CronJob/job c env VALIDATOR_IMAGE"),
    ]
