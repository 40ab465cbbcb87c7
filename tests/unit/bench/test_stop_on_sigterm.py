"""A bench stopped with SIGTERM unwinds (bench/benchkit.py's stop_on_sigterm): its `finally`
blocks run, so the control plane it started is stopped rather than left running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"

CHILD = """
import sys, time
sys.path.insert(0, {bench!r})
from benchkit import stop_on_sigterm
stop_on_sigterm()
try:
    open({ready!r}, "w").close()
    time.sleep(60)
finally:
    open({cleaned!r}, "w").close()
"""


def test_sigterm_runs_the_finally_blocks_and_exits_143(tmp_path: Path) -> None:
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    code = CHILD.format(bench=str(BENCH), ready=str(ready), cleaned=str(cleaned))
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert child.poll() is None, "the child exited before it was ready"
        assert time.monotonic() < deadline, "the child never got ready"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 128 + signal.SIGTERM
    assert cleaned.exists(), "the finally block did not run"
