"""A real node's cgroups on this machine: the kubelet's cgroup root under
``/<hierarchy>/gpu-operator-sim/<node>-<hash of its directory>`` in every mounted hierarchy, made
before the kubelet starts, emptied (SIGKILL to what is left) and removed on stop, and `cleanup`
after `sim down`."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from pathlib import Path

from gpu_operator.sim.realnode.nodens import Sandbox

CGROUP_PARENT = "gpu-operator-sim"
CGROUP_FS = Path("/sys/fs/cgroup")


def cgroup_name(node: str, base_dir: Path) -> str:
    """The node's cgroup directory name: its name and its directory's, so that two real nodes
    (two test sessions, a test session and `sim up`) never share cgroups."""
    return f"{node}-{hashlib.sha256(str(Path(base_dir).absolute()).encode()).hexdigest()[:8]}"


def cgroup_dirs(node: str) -> list[Path]:
    """The node's cgroup root in every mounted v1 hierarchy (or the v2 mount)."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS / CGROUP_PARENT / node]
    return [
        h / CGROUP_PARENT / node
        for h in sorted(CGROUP_FS.iterdir())
        if h.is_dir() and not h.is_symlink() and (h / "cgroup.procs").exists()
    ]


def make_cgroups(node: str) -> None:
    for leaf in cgroup_dirs(node):
        for level in (leaf.parent, leaf):
            if level.exists():
                continue
            level.mkdir()
            # A v1 cpuset child starts empty and takes no tasks until given cpus and mems.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (level / knob).exists():
                    (level / knob).write_text((level.parent / knob).read_text())


def cgroup_pids(leaf: Path) -> set[int]:
    pids: set[int] = set()
    for procs in leaf.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(pid) for pid in procs.read_text().split())
    return pids


def kill_cgroup_members(node: str, timeout: float = 15.0) -> set[int]:
    """SIGKILL every process left in the node's cgroups (containers live in mount namespaces of
    their own, so only their cgroups find them all) until none is left; returns the pids seen."""
    leaves = [leaf for leaf in cgroup_dirs(node) if leaf.exists()]
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while (pids := set().union(*(cgroup_pids(leaf) for leaf in leaves))) and time.monotonic() < deadline:
        seen |= pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return seen


def remove_cgroups(node: str) -> list[str]:
    """Kill what is left in the node's cgroup trees, then rmdir them bottom-up; returns what could
    not be removed."""
    kill_cgroup_members(node)
    left = []
    for leaf in cgroup_dirs(node):
        if not leaf.exists():
            continue
        for path in sorted((p for p in leaf.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        for level in (leaf, leaf.parent):
            try:
                level.rmdir()
            except OSError:
                if level == leaf:
                    left.append(str(level))
    return left


def cleanup(base_dir: Path, name: str, holder: int) -> None:
    """After `sim down` stopped the recorded processes: kill what is left in the sandbox (shims,
    containers) and remove the node's cgroups. Safe to repeat."""
    if holder:
        Sandbox(base_dir, holder=holder).stop(grace=2.0)
    remove_cgroups(cgroup_name(name, base_dir))
