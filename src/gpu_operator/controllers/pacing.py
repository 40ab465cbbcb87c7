"""Writes shaped to the apiserver: an adaptive bound on requests in flight.

`AdaptiveLimit` is the pure decision (no clock, no I/O): it grows while the latency it is fed
stays near the lowest latency of the recent answers (slow start: +1 per completion, i.e.
doubling per round trip; then +1 per round trip), and shrinks on overload (429 or 5xx: halved,
down to `minimum`) or on a latency rise (x0.9, at most once per round trip, never below
`floor`, by default `initial`: a latency rise alone may be our own event loop or a neighbour
on the machine, not the apiserver refusing work). `AdaptiveGate` applies it to coroutines."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


def overloaded(code: int) -> bool:
    """The apiserver asks us to slow down (429, APF) or is failing (5xx)."""
    return code == 429 or code >= 500


@dataclass
class AdaptiveLimit:
    initial: int = 4
    minimum: int = 1
    maximum: int = 64
    tolerance: float = 2.0
    """A smoothed latency above `tolerance` x the baseline counts as a rise."""
    smoothing: float = 0.2
    """Weight of the newest sample in the smoothed latency."""
    floor: int | None = None
    """The lowest a latency rise alone takes the limit (None: `initial`); overload goes lower."""
    window: int = 256
    """The baseline is the lowest latency among this many recent answers, so that it follows a
    machine whose load changes instead of remembering one lucky answer."""
    limit: float = field(init=False)
    recent: deque[float] = field(default_factory=deque, init=False)
    smoothed: float | None = field(default=None, init=False)
    slow_start: bool = field(default=True, init=False)
    since_decrease: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.limit = float(max(self.minimum, min(self.maximum, self.initial)))

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now."""
        return max(self.minimum, int(self.limit))

    def record(self, latency: float, code: int = 200) -> None:
        """One request finished after `latency` seconds with HTTP status `code`."""
        self.since_decrease += 1
        if overloaded(code):
            self._decrease(0.5, force=True)
            return
        self.recent.append(latency)
        if len(self.recent) > self.window:
            self.recent.popleft()
        self.smoothed = (
            latency if self.smoothed is None else (self.smoothed + (latency - self.smoothed) * self.smoothing)
        )
        if self.smoothed > self.tolerance * self.baseline:
            self._decrease(0.9, floor=self.initial if self.floor is None else self.floor)
        elif code < 400:  # refusals (403, 409) say nothing about capacity: no growth on them
            self.limit = min(float(self.maximum), self.limit + (1.0 if self.slow_start else 1.0 / self.limit))

    @property
    def baseline(self) -> float:
        return min(self.recent) if self.recent else 0.0

    def _decrease(self, factor: float, force: bool = False, floor: int | None = None) -> None:
        if not force and self.since_decrease < self.limit:
            return  # one decrease per round trip: the requests in flight still carry the old load
        self.slow_start = False
        self.since_decrease = 0
        lowest = float(self.minimum if floor is None else max(self.minimum, floor))
        self.limit = max(min(lowest, self.limit), self.limit * factor)


class AdaptiveGate:
    """At most `limit.allowed` bodies inside `slot()` at once; each slot's latency and outcome feed
    the limit. `slot()` yields a one-item list: set `[code]` to the answer's HTTP status when not 200."""

    def __init__(
        self,
        limit: AdaptiveLimit,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.limit = limit
        self.clock = clock
        self.in_flight = 0
        self.peak = 0
        self.on_change = on_change
        self._free = asyncio.Condition()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[list[int]]:
        async with self._free:
            await self._free.wait_for(lambda: self.in_flight < self.limit.allowed)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        outcome = [200]
        start = self.clock()
        try:
            yield outcome
        finally:
            before = self.limit.allowed
            self.limit.record(self.clock() - start, outcome[0])
            if self.on_change is not None and self.limit.allowed != before:
                self.on_change(self.limit.allowed)
            async with self._free:
                self.in_flight -= 1
                # Wake only as many waiters as there are free slots, not every waiter.
                self._free.notify(max(0, self.limit.allowed - self.in_flight))
