"""One way for tests to wait: poll a condition until it holds, never sleep a guessed time.

`wait_for(what, observe)` calls `observe()` until its value is truthy (or `until(value)` holds) and
returns that value. On timeout it fails with what it waited for, the last value it observed and,
if given, `context()` (an operator log, say), so a failure reads as a finding, not as a hang.
An exception raised by `observe` propagates at once: a refusal is never retried into a timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    observe: Callable[[], T],
    *,
    until: Callable[[T], Any] = bool,
    timeout: float = 90.0,
    interval: float = 0.3,
    context: Callable[[], object] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = observe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.0f}s waiting for {what}; last observed: {value!r}"
            raise AssertionError(message + (f"\n{context()}" if context else ""))
        time.sleep(interval)
