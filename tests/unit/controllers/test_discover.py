"""ClusterInfo.discover(): no made-up Kubernetes version; failures are retried with backoff until they answer."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.settings import Backoff
from gpu_operator.kube.client import Kube
from gpu_operator.kube.pages import Answer

FAST = Backoff(initial=0.01, cap=0.02)


class FlakyKube:
    """Answers /version with the given results in turn (an exception is raised); CRD absent."""

    def __init__(self, *versions: Any) -> None:
        self.versions = list(versions)
        self.calls = 0

    async def server_version(self) -> str:
        self.calls += 1
        result = self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]
        if isinstance(result, Exception):
            raise result
        return str(result)

    async def get_dict(self, *_: Any, **__: Any) -> dict[str, Any] | None:
        return None

    async def get_answer(self, path: str, *_: Any, **__: Any) -> Answer:
        return Answer(404, "404 page not found", path=path)  # no ClusterVersion: not OpenShift


def test_discover_retries_until_the_apiserver_answers(caplog: pytest.LogCaptureFixture) -> None:
    kube = FlakyKube(ConnectionError("connection refused"), "", "1.36.3")
    with caplog.at_level(logging.WARNING, logger="gpu_operator.operator"):
        info = asyncio.run(ClusterInfo.discover(cast(Kube, kube), asyncio.Event(), FAST))
    assert info is not None
    assert (info.k8s_version, info.servicemonitor_crd, kube.calls) == ("1.36.3", False, 3)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "connection refused" in messages[0] and "without a gitVersion" in messages[1]


def test_discover_gives_up_only_when_stopped() -> None:
    kube = FlakyKube(ConnectionError("connection refused"))
    stop = asyncio.Event()

    async def scenario() -> ClusterInfo | None:
        async def stop_after_three_tries() -> None:
            while kube.calls < 3:  # a condition, not a guessed time: stopped while still retrying
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.create_task(asyncio.wait_for(stop_after_three_tries(), timeout=30))
        found = await ClusterInfo.discover(cast(Kube, kube), stop, FAST)
        await stopper
        return found

    assert asyncio.run(scenario()) is None
    assert kube.calls >= 3
