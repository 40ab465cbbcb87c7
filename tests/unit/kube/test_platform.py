"""OpenShift at run time: the ClusterVersion `version` is the signal (as NVIDIA's operator reads
it), its first Completed update the version; start-up discovery carries it to the renderer."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.kube.client import Kube
from gpu_operator.kube.pages import Answer
from gpu_operator.kube.platform import PlatformError, openshift_version, platform_name

PATH = "/apis/config.openshift.io/v1/clusterversions/version"


def cluster_version(*history: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "config.openshift.io/v1",
        "kind": "ClusterVersion",
        "metadata": {"name": "version"},
        "status": {"history": [{"state": state, "version": version} for state, version in history]},
    }


@pytest.mark.parametrize(
    ("history", "version"),
    [
        ((("Completed", "4.17.3"),), "4.17"),
        ((("Partial", "4.18.0"), ("Completed", "4.17.3"), ("Completed", "4.16.9")), "4.17"),  # newest first
        ((("Completed", "5"),), "5"),
    ],
)
def test_version_is_the_newest_completed_update(history: tuple[tuple[str, str], ...], version: str) -> None:
    assert openshift_version(cluster_version(*history)) == version
    assert platform_name(version) == f"OpenShift {version}"


def test_no_cluster_version_is_not_openshift() -> None:
    assert openshift_version(None) == ""
    assert platform_name("") == "Kubernetes"


def test_no_completed_update_is_an_error_naming_the_object() -> None:
    with pytest.raises(PlatformError, match="ClusterVersion version"):
        openshift_version(cluster_version(("Partial", "4.18.0")))


class FakeKube:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.paths: list[str] = []

    async def server_version(self) -> str:
        return "1.36.3"

    async def get_dict(self, *_: Any, **__: Any) -> dict[str, Any] | None:
        return None

    async def get_answer(self, path: str, *_: Any, **__: Any) -> Answer:
        self.paths.append(path)
        return Answer(self.answer.status, self.answer.text, self.answer.error, path)


@pytest.mark.parametrize(
    ("answer", "version"),
    [
        (Answer(200, json.dumps(cluster_version(("Completed", "4.17.3")))), "4.17"),
        (Answer(404, "404 page not found"), ""),  # the group is not served: plain Kubernetes
    ],
)
def test_discovery_reads_the_platform(answer: Answer, version: str) -> None:
    kube = FakeKube(answer)
    info = asyncio.run(ClusterInfo.read(cast(Kube, kube)))
    assert (info.openshift_version, info.openshift) == (version, bool(version))
    assert kube.paths == [PATH]


@pytest.mark.parametrize(
    "answer", [Answer(403, json.dumps({"message": "forbidden"})), Answer(None, error="refused")]
)
def test_any_other_answer_fails_discovery(answer: Answer) -> None:
    with pytest.raises(PlatformError, match=PATH):
        asyncio.run(ClusterInfo.read(cast(Kube, FakeKube(answer))))
