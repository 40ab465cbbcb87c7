"""The simulator's state file and process stopping (real child processes, no control plane)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_operator.shapes import ShapeError
from gpu_operator.sim.commands import session
from gpu_operator.sim.commands.state import Proc, SimState, start_time


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session (as the simulator's components are), ignoring nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def stubborn(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process that ignores SIGTERM: only SIGKILL ends it."""
    ready = tmp_path / "ready"
    code = (
        f"import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    while not ready.exists():
        assert proc.poll() is None
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_a_recorded_process_is_alive_only_with_its_own_start_time(sleeper: subprocess.Popen[bytes]) -> None:
    proc = Proc.of("sleeper", sleeper.pid)
    assert proc.alive and proc.started == start_time(sleeper.pid)
    # Same pid, other start time: a recycled pid must never be taken for ours.
    assert not Proc("sleeper", sleeper.pid, proc.started + 1).alive
    assert not Proc("gone", 2**22 + 7, 1).alive


def test_stop_terminates_then_reports_nothing_to_do(sleeper: subprocess.Popen[bytes]) -> None:
    proc = Proc.of("sleeper", sleeper.pid)
    assert proc.stop(timeout=5)
    assert sleeper.wait(5) == -15
    assert not proc.stop()


def test_stop_kills_what_ignores_sigterm(stubborn: subprocess.Popen[bytes]) -> None:
    proc = Proc.of("stubborn", stubborn.pid)
    assert proc.stop(timeout=0.5)
    assert stubborn.wait(5) == -9


def test_state_round_trip_and_stop_order(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    state = SimState(
        dir=str(tmp_path),
        server="https://127.0.0.1:1",
        kubeconfig="k",
        binaries="b",
        processes=[Proc("etcd", 2**22 + 7, 1), Proc.of("operator", sleeper.pid)],
    )
    state.save()
    loaded = SimState.load(tmp_path)
    assert loaded == state
    assert loaded is not None and [p.name for p in loaded.alive()] == ["operator"]
    assert loaded.stop() == ["operator"]
    assert loaded.stop() == []


def test_a_corrupt_state_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{nope")
    with pytest.raises(RuntimeError, match=r"state.json is not a simulator state file"):
        SimState.load(tmp_path)


def test_down_is_idempotent_and_removes_the_state(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    SimState(
        dir=str(tmp_path),
        server="https://127.0.0.1:1",
        kubeconfig="k",
        binaries="b",
        processes=[Proc.of("operator", sleeper.pid)],
    ).save()
    messages: list[str] = []
    assert session.down(tmp_path, messages.append) == ["operator"]
    assert not (tmp_path / "state.json").exists() and "stopped operator" in messages[0]
    assert session.down(tmp_path, messages.append) == []


def test_up_checks_shapes_and_refuses_a_foreign_directory(tmp_path: Path) -> None:
    with pytest.raises(ShapeError, match="unknown node shape 'nope'"):
        session.up(tmp_path / "sim", ["nope:2"], print)
    assert not (tmp_path / "sim").exists()
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(session.SimError, match="not empty and holds no simulator state"):
        session.up(tmp_path, ["dgx-h100:1"], print)
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_default_dir_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpu_operator.sim.commands.state import default_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "gpu-operator" / "sim" / "current"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_dir() == Path(os.path.expanduser("~")) / ".cache" / "gpu-operator" / "sim" / "current"
