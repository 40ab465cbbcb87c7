"""The bench's operand sampler outlives a read the busy apiserver does not answer in time
(bench/scale.py's sample_operands): it died of the first ReadTimeout, and the progress line went on
repeating its last sample for the rest of the rollout."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import httpx2 as httpx

from tests.support.benchload import bench_module


class FlakyClient:
    """A lightkube Client whose first DaemonSet list times out."""

    def __init__(self) -> None:
        self.calls = 0

    def list(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls += 1
        if self.calls == 1:
            raise httpx.ReadTimeout("The read operation timed out")
        status = SimpleNamespace(numberReady=self.calls, desiredNumberScheduled=10)
        return [SimpleNamespace(status=status)]


def test_the_sampler_goes_on_after_a_read_timeout() -> None:
    scale = bench_module("scale")
    client = FlakyClient()
    samples: list[tuple[float, int, int]] = []

    async def run() -> None:
        task = asyncio.create_task(scale.sample_operands(client, time.monotonic(), samples, every=0.01))
        while len(samples) < 2 and not task.done():
            await asyncio.sleep(0.01)
        assert not task.done(), f"the sampler ended: {task.exception()!r}"
        task.cancel()

    asyncio.run(asyncio.wait_for(run(), 30))
    assert [s[1:] for s in samples[:2]] == [(2, 10), (3, 10)]
