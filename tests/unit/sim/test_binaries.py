"""The control-plane cache layout: which multicall binary each Kubernetes runs, and what makes a
cache directory complete."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_operator.sim.commands import session
from gpu_operator.sim.plane.binaries import Binaries, BinariesMissing


def _cache(root: Path, *, floor: bool = True) -> Binaries:
    (root / "bin").mkdir(parents=True)
    (root / "stages").mkdir()
    for name in ("kube", "etcd", "kwok", *(["kube-floor"] if floor else [])):
        path = root / "bin" / name
        path.write_text("#!/bin/sh\n")
        os.chmod(path, 0o755)
    return Binaries(root)


def test_the_floor_runs_its_own_binary_from_the_same_cache(tmp_path: Path) -> None:
    current = _cache(tmp_path)
    floor = current.of("floor")
    assert (current.kube.name, floor.kube.name) == ("kube", "kube-floor")
    assert (floor.etcd, floor.kwok) == (current.etcd, current.kwok)
    assert current.complete() and floor.complete()
    with pytest.raises(BinariesMissing, match="choose one of current, floor"):
        current.of("1.28")


def test_a_cache_without_the_floor_serves_the_current_kubernetes_only(tmp_path: Path) -> None:
    cache = _cache(tmp_path, floor=False)
    assert not cache.complete() and not cache.complete("floor")
    assert cache.complete("current")  # the demo and all but tests/floor never wait for the floor


def test_locate_asks_the_floor_only_of_the_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_operator.sim.plane import binaries

    _cache(tmp_path, floor=False)
    monkeypatch.setenv(binaries.ENV, str(tmp_path))
    assert binaries.locate(build=False).kube == tmp_path / "bin" / "kube"
    with pytest.raises(BinariesMissing, match="does not hold bin/kube-floor"):
        binaries.locate(build=False, kubernetes="floor")


def test_the_build_script_is_asked_for_the_floor_only_when_the_floor_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_operator.sim.plane import binaries

    script = tmp_path / "build.sh"
    # A stand-in build script: builds a cache with the floor only when not told --without-floor.
    script.write_text(
        'root=$(dirname "$0")/cache; mkdir -p "$root/bin" "$root/stages"\n'
        'for b in kube etcd kwok; do printf "#!/bin/sh\\n" > "$root/bin/$b"; done\n'
        '[ "$1" = --without-floor ] || printf "#!/bin/sh\\n" > "$root/bin/kube-floor"\n'
        'chmod +x "$root"/bin/*; echo "$root"\n'
    )
    monkeypatch.delenv(binaries.ENV, raising=False)
    monkeypatch.setattr(binaries, "build_script", lambda tool="controlplane": script)
    current = binaries.locate(build=True)
    assert current.complete("current") and not (current.root / "bin" / "kube-floor").exists()
    assert binaries.locate(build=True, kubernetes="floor").complete("floor")


def test_the_simulator_refuses_a_real_node_on_the_floor(tmp_path: Path) -> None:
    with pytest.raises(session.SimError, match="--real-node runs the current Kubernetes"):
        session.up(
            tmp_path / "sim", [], lambda _msg: None, build=False, real_node="host-driver", kubernetes="floor"
        )
    with pytest.raises(session.SimError, match="--kubernetes oldest: choose one of current, floor"):
        session.up(tmp_path / "sim", [], lambda _msg: None, build=False, kubernetes="oldest")
    assert not (tmp_path / "sim").exists()  # refused before anything started


def test_up_does_not_reuse_a_simulator_of_another_kubernetes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_operator.sim.commands.state import SimState

    live = SimState(dir=str(tmp_path), server="https://127.0.0.1:1", kubeconfig="k", binaries="b")
    monkeypatch.setattr(session, "running", lambda _directory: live)
    with pytest.raises(session.SimError, match="runs Kubernetes current, not floor: stop it first"):
        session.up(tmp_path, [], lambda _msg: None, build=False, kubernetes="floor")
    assert session.up(tmp_path, [], lambda _msg: None, build=False) == (live, False)
