"""Host-root fixtures built from YAML data (tests/fixtures/hosts) with the simulator's host-tree
builder (gpu_operator.sim.hardware.hosttree), plus the kernel simulator bound to each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.hardware.hosttree import HostSpecError as FixtureError
from tests.support.hostsim.kernelsim import KernelSimulator

__all__ = ["FakeHost", "FixtureError", "build", "build_file", "load_spec"]


@dataclass
class FakeHost:
    """A built fixture: its HostFS and the data it came from (the simulator reads driver tables from it)."""

    fs: HostFS
    spec: dict[str, Any]

    def kernel(self) -> KernelSimulator:
        return KernelSimulator(self.fs, extra_matches=self.spec.get("driver_matches") or {})


def build(spec: dict[str, Any], root: str | os.PathLike[str]) -> FakeHost:
    """Create the host root described by `spec` under `root` (which should be empty)."""
    return FakeHost(hosttree.build(spec, root), spec)


def load_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A fixture's data; `extends: NAME` starts from NAME.yaml beside it (top-level keys replaced, `files` merged)."""
    path = Path(path)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise FixtureError(f"{path}: a host fixture is a mapping (description, os, devices, files ...)")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    base = load_spec(path.with_name(f"{parent}.yaml"))
    files = {**(base.get("files") or {}), **(data.get("files") or {})}
    merged = {**base, **data, "files": {k: v for k, v in files.items() if v is not None}}
    return merged


def build_file(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> FakeHost:
    return build(load_spec(path), root)
