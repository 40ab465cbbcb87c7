"""Fixtures for the Kubernetes floor: a control plane of the oldest Kubernetes we support
(tools/controlplane/kube-floor, the chart's kubeVersion) for this directory's modules, with the
integration tests' function-scoped fixtures (fake nodes, operator processes, policies) on top."""

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

control_plane, kube, crds = module_plane_fixtures("floor-controlplane", kubernetes="floor")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.integration)
