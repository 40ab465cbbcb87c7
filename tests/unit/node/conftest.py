"""Host-root fixtures for the node agents' tests, built from tests/fixtures/hosts/*.yaml."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostsim import fakehost
from tests.unit.node.nodekit import HOSTS_DIR

BuildHost = Callable[..., fakehost.FakeHost]


@pytest.fixture
def build_host(tmp_path: Path) -> BuildHost:
    """build_host(name, **changes): the named fixture, with top-level keys replaced by `changes`."""
    counter = iter(range(1000))

    def build(name: str, **changes: Any) -> fakehost.FakeHost:
        spec = fakehost.load_spec(HOSTS_DIR / f"{name}.yaml")
        spec.update(changes)
        return fakehost.build(spec, tmp_path / f"{name}-{next(counter)}" / "root")

    return build
