"""discover(): no made-up Kubernetes version; failures are retried with backoff until they answer."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from gpu_operator.controllers.operator import Operator
from gpu_operator.controllers.settings import Backoff, OperatorSettings
from gpu_operator.kube.client import Kube

FAST = OperatorSettings(discovery_backoff=Backoff(initial=0.01, cap=0.02))


class FlakyKube:
    """Answers /version with the given results in turn (an exception is raised); CRD absent."""

    http: Any = None  # the Node reflector's client and line streams: not used before discovery
    streams: Any = None

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


def _operator(kube: FlakyKube) -> Operator:
    return Operator(cast(Kube, kube), "gpu-operator", FAST)


def test_discover_retries_until_the_apiserver_answers(caplog: pytest.LogCaptureFixture) -> None:
    kube = FlakyKube(ConnectionError("connection refused"), "", "1.36.3")
    operator = _operator(kube)
    with caplog.at_level(logging.WARNING, logger="gpu_operator.operator"):
        assert asyncio.run(operator.discover()) is True
    assert (operator.k8s_version, operator.servicemonitor_crd, kube.calls) == ("1.36.3", False, 3)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "connection refused" in messages[0] and "without a gitVersion" in messages[1]


def test_discover_gives_up_only_when_stopped() -> None:
    kube = FlakyKube(ConnectionError("connection refused"))
    operator = _operator(kube)

    async def scenario() -> bool:
        async def stop_after_three_tries() -> None:
            while kube.calls < 3:  # a condition, not a guessed time: stopped while still retrying
                await asyncio.sleep(0.01)
            operator.stop.set()

        stopper = asyncio.create_task(asyncio.wait_for(stop_after_three_tries(), timeout=30))
        found = await operator.discover()
        await stopper
        return found

    assert asyncio.run(scenario()) is False
    assert operator.k8s_version == "" and kube.calls >= 3
