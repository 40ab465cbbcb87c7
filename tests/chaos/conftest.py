"""Fixtures for the chaos tests: faults injected into a real control plane and real operator
processes (SIGKILL, SIGSTOP, killed apiserver or etcd, a slow proxy in front of the apiserver).

Each test module gets a control plane of its own: a test that kills etcd must not disturb the
integration tests' shared one, and 200-node crash runs leave no nodes behind for others. The
function-scoped fixtures (fake nodes, operator processes, policies) are the integration ones.

GPU_OPERATOR_CHAOS_HEAVY=1 (tests/support/chaos.py) runs the benchmark-machine variants (200 nodes, every crash point on
its own run); the default variants keep `./dev test` short on a small machine.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import fake_nodes  # noqa: F401
from tests.integration.operator_fixtures import (  # noqa: F401
    cluster_policies,
    operator_namespace,
    start_operator,
)
from tests.support.planes import module_plane_fixtures

control_plane, kube, crds = module_plane_fixtures("chaos-controlplane")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.chaos)
