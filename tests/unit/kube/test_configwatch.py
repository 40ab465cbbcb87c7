"""The one user ConfigMap watched by name (kube/configwatch.py): a change of its content is
reported once (the first sight too), the same content again is not, its deletion is; following
another name stops the old watch; a failed watch is started again after the backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from gpu_operator.kube.client import Kube
from gpu_operator.kube.configwatch import ConfigMapWatch


class FakeClient:
    """`watch` yields the events queued for the name its field selector asks for."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[tuple[str, ConfigMap] | Exception]] = {}
        self.asked: list[tuple[str | None, dict[str, str]]] = []

    def queue(self, name: str) -> asyncio.Queue[tuple[str, ConfigMap] | Exception]:
        return self.queues.setdefault(name, asyncio.Queue())

    async def watch(self, resource: Any, *, namespace: str, fields: dict[str, str]) -> AsyncIterator[Any]:
        self.asked.append((namespace, dict(fields)))
        q = self.queue(fields["metadata.name"])
        while True:
            item = await q.get()
            if isinstance(item, Exception):
                raise item
            yield item


def over(client: FakeClient) -> Kube:
    """A Kube whose client is the fake (all the watch uses of it)."""
    return cast(Kube, SimpleNamespace(client=client))


def configmap(name: str, **data: str) -> ConfigMap:
    return ConfigMap(metadata=ObjectMeta(name=name, labels={"any": "label"}), data=data)


def test_content_changes_are_reported_once_each_and_following_another_name_stops_the_old_watch() -> None:
    async def scenario() -> tuple[list[str], list[tuple[str | None, dict[str, str]]], int]:
        client = FakeClient()
        seen: list[str] = []
        watch = ConfigMapWatch(over(client), "gpu-operator", seen.append, lambda _n: 0.0)
        watch.follow("time-slicing")
        q = client.queue("time-slicing")
        for item in (
            ("ADDED", configmap("time-slicing", a="1")),
            ("MODIFIED", configmap("time-slicing", a="1")),  # metadata only: no report
            ("MODIFIED", configmap("time-slicing", a="2")),
            RuntimeError("the watch broke"),  # started again after the backoff
            ("ADDED", configmap("time-slicing", a="2")),  # the same content seen again
            ("DELETED", configmap("time-slicing", a="2")),
        ):
            await q.put(item)
        for _ in range(50):
            await asyncio.sleep(0)
        watch.follow("other")
        await client.queue("time-slicing").put(
            ("MODIFIED", configmap("time-slicing", a="3"))
        )  # no longer followed
        await client.queue("other").put(("ADDED", configmap("other", b="1")))
        for _ in range(50):
            await asyncio.sleep(0)
        await watch.stop()
        return seen, client.asked, client.queue("time-slicing").qsize()

    seen, asked, left = asyncio.run(scenario())
    assert seen == [
        "time-slicing",
        "time-slicing",
        "time-slicing",
        "other",
    ]  # first, a=2, deleted; other's first
    assert asked == [("gpu-operator", {"metadata.name": "time-slicing"})] * 2 + [
        ("gpu-operator", {"metadata.name": "other"})
    ]
    assert left == 1  # the old name's watch was stopped: its event was never read


def test_no_name_no_watch() -> None:
    async def scenario() -> list[tuple[str | None, dict[str, str]]]:
        client = FakeClient()
        watch = ConfigMapWatch(over(client), "ns", lambda _n: None, lambda _n: 0.0)
        watch.follow(None)
        await asyncio.sleep(0)
        await watch.stop()
        return client.asked

    assert asyncio.run(scenario()) == []
