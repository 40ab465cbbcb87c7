"""Whether the apiserver answers, for the operator's /readyz: a process that has lost its
apiserver (killed, restarting, etcd down behind it) reports not ready until it answers again.

One GET of the apiserver's own /readyz (readable by everyone, no RBAC) per period; readiness
drops after `failures_to_drop` misses in a row, so one dropped connection does not flap it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from gpu_operator.kube.client import Kube

log = logging.getLogger("gpu_operator.apihealth")


@dataclass
class ApiHealth:
    kube: Kube
    period: float = 3.0
    timeout: float = 3.0
    failures_to_drop: int = 2
    failures: int = 0
    down_since: float | None = None
    last_error: str = ""

    @property
    def ok(self) -> bool:
        return self.failures < self.failures_to_drop

    async def check(self) -> None:
        try:
            answer = await self.kube.read_readyz(timeout=self.timeout)
            if answer.status is None:
                raise RuntimeError(answer.error)
            if answer.status != 200:
                raise RuntimeError(f"/readyz answered {answer.status}: {answer.text[:200]}")
        except Exception as err:  # refused, timed out, TLS, 5xx: all mean "not reachable now"
            self.failures += 1
            self.last_error = str(err) or type(err).__name__
            if self.failures == self.failures_to_drop:
                self.down_since = time.time()
                log.warning("apiserver not ready (%s); reporting not ready until it answers", self.last_error)
            return
        if not self.ok:
            log.info("apiserver answers again after %.0f s", time.time() - (self.down_since or time.time()))
        self.failures, self.down_since = 0, None

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.period)
