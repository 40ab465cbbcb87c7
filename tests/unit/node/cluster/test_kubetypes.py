"""Decoding from several threads (src/gpu_operator/node/cluster/kubetypes.py): once `prepare()` has built
lightkube's types in one thread, threads that decode lists for the first time at once, then large
kwok-shaped lists for seconds (beside the operator's own decoders and its event loop's reads, new
decoders, garbage collection that gives up the GIL, and a buffer written while it is decoded)
leave the process alive and every decode right; the node agents' watches and the simulator's
stand-ins prepare before they start their threads. Each run is its own process: a crash is a
signal exit, and a signal exit fails the test (the child that aborts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[4]


def run_python(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def survived(done: subprocess.CompletedProcess[str]) -> str:
    how = f"killed by signal {-done.returncode}, -11: SIGSEGV" if done.returncode < 0 else "no signal"
    return f"exit {done.returncode} ({how})\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def stress_counts(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """The stress's counts; fails on any exit but 0 (a signal exit is negative) and on a wrong decode."""
    assert done.returncode == 0, survived(done)
    counts: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["wrong"] == 0, survived(done)
    return counts


STRESS = ["-m", "tests.support.decode_stress", "--threads", "4", "--items", "1000", "--seconds", "4"]


def test_threads_decode_first_and_large_lists_without_a_crash() -> None:
    counts = stress_counts(run_python([*STRESS, "--yield-in-gc"]))
    # the first decodes (4 threads, 7 lists each) and at least one large list per thread after them
    assert counts["decodes"] >= 4 * 7 + 4, counts
    assert counts["gc_yields"] > 0, counts  # collections started inside the decodes


def test_a_child_that_dies_of_a_signal_fails_the_stress_test() -> None:
    done = run_python([*STRESS, "--abort"])
    assert done.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in done.stderr  # the fault handler's stacks come back
    with pytest.raises(AssertionError, match="killed by signal 6"):
        stress_counts(done)


# The health agent's request watch, as node/cluster/kubeapi.py starts it: its thread's first decode of a
# Pod list while the starting thread makes its own first one.
WATCH_BESIDE_THE_CALLER = textwrap.dedent("""
    import threading
    from lightkube.core import decoders
    from lightkube.resources.core_v1 import Pod
    from gpu_operator.node.cluster.kubeapi import _Watch
    from tests.support.decode_shapes import body, pod

    data = body("PodList", [pod(i) for i in range(300)])
    seen = threading.Event()

    def watch():
        _, _, items = decoders.decode_list(data, Pod)
        return iter([("ADDED", items[-1])])

    def keep(obj):
        assert obj.metadata.name == "pod-299"
        seen.set()

    _Watch("Pods", watch, keep, print)
    _, _, items = decoders.decode_list(data, Pod)
    assert len(items) == 300
    assert seen.wait(60)
    print("ok")
""")


@pytest.mark.parametrize("attempt", range(3))
def test_the_node_agents_watch_decodes_beside_its_caller(attempt: int) -> None:
    done = run_python(["-c", WATCH_BESIDE_THE_CALLER])
    assert done.returncode == 0, survived(done)
    assert done.stdout.split() == ["ok"]


def test_the_stand_ins_prepare_before_their_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_operator.node.cluster import kubetypes
    from gpu_operator.sim.standins import roster

    calls: list[bool] = []
    monkeypatch.setattr(kubetypes, "prepare", lambda: calls.append(made[0]._thread.ident is None))
    monkeypatch.setattr(roster.StandIns, "_main", lambda self: self._ready.set())
    made: list[Any] = [roster.StandIns(config=None)]
    made[0].start()
    made[0]._thread.join(5)
    assert calls == [True]  # called once, before the stand-ins' thread was started


def test_prepare_builds_once_per_process() -> None:
    done = run_python(
        ["-c", "from gpu_operator.node.cluster import kubetypes as k; print(k.prepare(), k.prepare())"]
    )
    assert done.returncode == 0, survived(done)
    assert done.stdout.split() == ["True", "False"]
