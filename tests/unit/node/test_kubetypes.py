"""Decoding from several threads (src/gpu_operator/node/kubetypes.py): once `prepare()` has built
lightkube's types in one thread, threads that decode lists for the first time at once, then large
lists for seconds (beside the operator's own decoders, new decoders and garbage collection) leave
the process alive and every decode right; the node agents' watches and the simulator's stand-ins
prepare before they start their threads. Each run is its own process: a crash is a signal exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run_python(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def survived(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode} (-11: SIGSEGV)\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_threads_decode_first_and_large_lists_without_a_crash() -> None:
    done = run_python(
        ["-m", "tests.support.decode_stress", "--threads", "4", "--items", "1000", "--seconds", "4"]
    )
    assert done.returncode == 0, survived(done)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["wrong"] == 0
    # the first decodes (4 threads, 7 lists each) and at least one large list per thread after them
    assert counts["decodes"] >= 4 * 7 + 4, counts


# The health agent's request watch, as node/kubeapi.py starts it: its thread's first decode of a
# Pod list while the starting thread makes its own first one.
WATCH_BESIDE_THE_CALLER = textwrap.dedent("""
    import threading
    from lightkube.core import decoders
    from lightkube.resources.core_v1 import Pod
    from gpu_operator.node.kubeapi import _Watch
    from tests.support.decode_stress import body, pod

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
    from gpu_operator.node import kubetypes
    from gpu_operator.sim import standins

    calls: list[bool] = []
    monkeypatch.setattr(kubetypes, "prepare", lambda: calls.append(made[0]._thread.ident is None))
    monkeypatch.setattr(standins.StandIns, "_main", lambda self: self._ready.set())
    made: list[Any] = [standins.StandIns(config=None)]
    made[0].start()
    made[0]._thread.join(5)
    assert calls == [True]  # called once, before the stand-ins' thread was started


def test_prepare_builds_once_per_process() -> None:
    done = run_python(["-c", "from gpu_operator.node import kubetypes as k; print(k.prepare(), k.prepare())"])
    assert done.returncode == 0, survived(done)
    assert done.stdout.split() == ["True", "False"]
