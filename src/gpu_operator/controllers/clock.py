"""Time as the operator's loops read it, handed in so that a test can move it: wall time (epoch
seconds, for times written on objects and compared with theirs), monotonic time (durations,
waits) and an asynchronous sleep. Production code uses `REAL`; a test builds a `Clock` of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


REAL = Clock()
