"""Fixtures the device-plugin stand-in's tests share: an L40S host tree with its driver, and the
kubelet's device-plugins directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.sim.hardware import hosttree
from gpu_operator.sim.realnode.realspec import host_spec


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    hosttree.build(host_spec("host-driver"), root)
    return root


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    path = tmp_path / "dp"
    path.mkdir()
    return path
