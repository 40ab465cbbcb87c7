"""The load-time checks refuse only what could never work: real-world values upstream accepts still load."""

from __future__ import annotations

import pydantic
import pytest

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.nvidiadriver import NVIDIADriver

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "spec",
    [
        {"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "595.91.07"}},
        {"driver": {"repository": "localhost:5000/my_org/gpu", "version": "595.91.07-ubuntu22.04"}},
        {"driver": {"repository": "Registry.Example.com:443/nvidia", "version": DIGEST}},
        {"toolkit": {"image": "nvcr.io/nvidia/k8s/container-toolkit:v1.17.8-ubuntu20.04"}},
        {"devicePlugin": {"image": f"ghcr.io/org/plugin@{DIGEST}"}},
        {"driver": {"repository": "", "image": "", "version": "", "imagePullPolicy": ""}},
        {"driver": {"repoConfig": {"configMapName": ""}, "licensingConfig": {"secretName": ""}}},
        {
            "daemonsets": {
                "labels": {"example.com/team": "gpu", "tier": ""},
                "priorityClassName": "system-node-critical",
                "annotations": {"kubernetes.io/description": "any text: is fine here"},
                "rollingUpdate": {"maxUnavailable": "1"},
            }
        },
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": "100%"}}},
        {
            "driver": {
                "env": [{"name": "lower.case-NAME_1", "value": "x"}],
                "resources": {
                    "limits": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1},
                    "requests": {"memory": "1.5e3", "cpu": "0.5"},
                },
            }
        },
        {"hostPaths": {"rootFS": "/", "driverInstallDir": ""}, "dcgm": {"hostPort": 5555}},
    ],
)
def test_real_world_values_load(spec: dict[str, object]) -> None:
    ClusterPolicy.model_validate({"spec": spec})


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"driver": {"repository": "nvcr.io/nvidia/"}}, ("spec", "driver", "repository")),
        ({"driver": {"version": "-dev"}}, ("spec", "driver", "version")),
        ({"daemonsets": {"labels": {"a/b/c": "x"}}}, ("spec", "daemonsets", "labels")),
        ({"daemonsets": {"labels": {"k" * 64: "x"}}}, ("spec", "daemonsets", "labels")),
        (
            {"driver": {"resources": {"requests": {"cpu": "1 core"}}}},
            ("spec", "driver", "resources", "requests", "cpu"),
        ),
    ],
)
def test_what_could_never_work_is_refused_naming_the_field(
    spec: dict[str, object], where: tuple[str, ...]
) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        ClusterPolicy.model_validate({"spec": spec})
    assert refused.value.errors()[0]["loc"] == where


def test_nvidiadriver_node_selector_keys_are_checked() -> None:
    NVIDIADriver.model_validate({"spec": {"nodeSelector": {"nvidia.com/gpu.product": "H100"}}})
    with pytest.raises(pydantic.ValidationError):
        NVIDIADriver.model_validate({"spec": {"nodeSelector": {"gpu product": "H100"}}})
