"""Fixtures for integration tests against the real control plane (kube-apiserver, etcd,
kube-controller-manager, kube-scheduler and kwok), started once per test session."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from typing import cast

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Namespace, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpu_operator.sim.plane import nodes
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.standins import roster
from tests.support.cleanup import delete_if_present
from tests.support.components import COMPONENT_ACCOUNT
from tests.support.planes import admin_client, running_plane


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_plane(tmp_path_factory, "controlplane") as plane:
        yield plane


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Iterator[Client]:
    """An admin lightkube client."""
    with admin_client(control_plane) as client:
        yield client


@pytest.fixture(scope="session")
def node_standins(control_plane: ControlPlane) -> Iterator[roster.StandIns]:
    """What node components do on kwok nodes once their pods run there, for the whole session
    (sim/standins/roster.py, as `sim up` runs them): GPU feature discovery's NodeFeature, the device
    plugin's `nvidia.com/gpu` capacity, the DRA kubelet plugin's ResourceSlice."""
    with roster.running(KubeConfig.from_file(control_plane.admin_kubeconfig)) as running:
        yield running
    assert running.error is None, f"the stand-ins failed: {running.error!r}"


@pytest.fixture(autouse=True)
def _node_standins_with_the_plane(request: pytest.FixtureRequest) -> None:
    """Every test on the shared control plane gets the node stand-ins (started by the first)."""
    if "control_plane" in request.fixturenames:
        request.getfixturevalue("node_standins")


@pytest.fixture
def nfd_master(control_plane: ControlPlane) -> Iterator[roster.StandIns]:
    """NFD's master (sim/standins/nfdmaster.py) for one test: NodeFeature labels onto the Nodes, as on a
    cluster whose user runs NFD. Opt-in: by default nothing plays it."""
    with roster.running(
        KubeConfig.from_file(control_plane.admin_kubeconfig), nodes=False, nfd=True
    ) as running:
        yield running
    assert running.error is None, f"the NFD master stand-in failed: {running.error!r}"


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    """A fresh namespace with the ServiceAccount a test's bare component pod runs as
    (`test_sim_standins.component_pod`): the stand-ins call with their pod's identity
    (sim/standins/identity.py), and such a pod has no rendered RBAC, so this one is bound to cluster-admin.
    The operator's own pods run as their rendered ServiceAccounts and Roles."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata={"name": name}))  # type: ignore[arg-type]
    kube.create(
        cast(
            ServiceAccount,
            ServiceAccount.from_dict({"metadata": {"name": COMPONENT_ACCOUNT, "namespace": name}}),
        )
    )
    binding = f"{COMPONENT_ACCOUNT}-{name}"
    kube.create(
        cast(
            ClusterRoleBinding,
            ClusterRoleBinding.from_dict(
                {
                    "metadata": {"name": binding},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": COMPONENT_ACCOUNT, "namespace": name}],
                }
            ),
        )
    )
    yield name
    delete_if_present(kube, ClusterRoleBinding, binding)
    delete_if_present(kube, Namespace, name)


@pytest.fixture
def fake_nodes(kube: Client) -> Iterator[Callable[..., list[str]]]:
    """`fake_nodes("dgx-h100:3")` creates Ready kwok nodes; all are removed after the test."""
    created: list[str] = []

    def add(*specs: str, wait: bool = True) -> list[str]:
        # Node names stay unique across the session: a deleted Node may linger in caches.
        names = nodes.add_nodes(kube, list(specs), start=next(_node_index) * 100)
        created.extend(names)
        if wait:
            nodes.wait_ready(kube, names)
        return names

    def remove(*names: str) -> None:
        nodes.remove_nodes(kube, list(names))
        for n in names:
            if n in created:
                created.remove(n)

    add.remove = remove  # type: ignore[attr-defined]
    yield add
    nodes.remove_nodes(kube, created)


_node_index = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.integration)


from tests.integration.operator_fixtures import (  # noqa: E402,F401
    cluster_policies,
    crds,
    nvidia_drivers,
    operator_namespace,
    start_operator,
)
from tests.integration.realnode_fixtures import (  # noqa: E402,F401
    device_plugin_pod,
    real_gpu_node,
    real_node,
    real_passthrough_node,
)
from tests.integration.registry_fixtures import registry, registry_image  # noqa: E402,F401
