"""One loop shape for every level-based controller of the operator (ClusterPolicy, NVIDIADriver,
driver upgrades): wait for a kick or the requeue time, coalesce, run one pass, and on failure
back off and record it the same way, with per-loop metrics.

A pass returns when it wants to run again (seconds, or None for "at the next kick"). A pass
that raises is retried after the reconcile backoff (1 s doubling to 60 s), reset by a success.
After a pass the next one waits at least twice as long as it took: node events come in bursts
(labelling a thousand nodes answers with a thousand events), and a full pass per event would
starve the labeller on the same event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from gpu_operator.controllers.leader import log_pass_failure
from gpu_operator.controllers.settings import OperatorSettings

log = logging.getLogger("gpu_operator.controllers")

PASSES = Counter("gpu_operator_controller_passes", "Passes of each controller loop, by result (ok, error)",
                 ["loop", "result"])
PASS_SECONDS = Gauge("gpu_operator_controller_pass_duration_seconds", "How long each loop's last pass took", ["loop"])


@dataclass
class PassLoop:
    """`name` (the loop's metric label and log words), its `kick`, and what one pass does."""

    name: str
    kick: asyncio.Event
    one_pass: Callable[[], Awaitable[float | None]]
    settings: OperatorSettings
    # Nothing to do right now (e.g. no NVIDIADriver): skip the pass and wait for the next kick.
    idle: Callable[[], bool] = field(default=lambda: False)
    # Called with the exception of a failed pass (after it is logged and counted).
    on_error: Callable[[BaseException], None] = field(default=lambda _err: None)
    failures: int = 0

    async def step(self, requeue: float | None, pause: float) -> tuple[float | None, float]:
        """One wait + pass; returns the next (requeue, pause)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.kick.wait(), timeout=requeue)
        await asyncio.sleep(pause)
        self.kick.clear()
        coalesce = self.settings.coalesce
        if self.idle():
            return None, coalesce
        started = time.monotonic()
        try:
            requeue = await self.one_pass()
        except Exception as err:  # keep serving: the next kick or the backoff retries
            self.failures += 1
            retry = self.settings.reconcile_backoff.delay(self.failures)
            log_pass_failure(log, f"{self.name} failed", self.failures, retry)
            PASSES.labels(self.name, "error").inc()
            self.on_error(err)
            return retry, coalesce
        took = time.monotonic() - started
        self.failures = 0
        PASSES.labels(self.name, "ok").inc()
        PASS_SECONDS.labels(self.name).set(took)
        return requeue, max(coalesce, 2 * took)

    async def run(self, ready: Callable[[], Awaitable[None]]) -> None:
        await ready()
        requeue: float | None = None
        pause = self.settings.coalesce
        while True:
            requeue, pause = await self.step(requeue, pause)
