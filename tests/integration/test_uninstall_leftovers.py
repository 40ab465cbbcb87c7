"""What an uninstall used to leave behind, on the real control plane: nodes a driver upgrade had
cordoned, the operator's Lease, and (when asked) our CRDs. `gpu-operator cleanup` is the chart's
pre-delete hook command; the operator is the process Helm stops afterwards."""

from __future__ import annotations

import datetime as dt
import functools
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.controllers.units.upgrade.state import (
    POD_DELETION_REQUIRED,
    UPGRADE_REQUIRED,
    WAIT_FOR_JOBS_REQUIRED,
)
from gpu_operator.kube.client import (
    FIELD_MANAGER,
    ClusterPolicyResource,
    GPUClusterResource,
    NVIDIADriverResource,
)
from gpu_operator.kube.crds import apply_crds
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import (
    NODE_FEATURE_GROUP,
    NODE_FEATURE_PLURAL,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_STATE,
)
from tests.support.status import reconciled
from tests.support.waiting import wait_for

NODE_FEATURE_CRD = f"{NODE_FEATURE_PLURAL}.{NODE_FEATURE_GROUP}"


def cleanup_command(control_plane: ControlPlane, *args: str) -> str:
    cli = str(Path(sys.executable).parent / "gpu-operator")
    done = subprocess.run(
        [cli, "cleanup", "--kubeconfig", str(control_plane.admin_kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr  # warnings (a CRD kept) go to stderr


def lease(kube: Client, namespace: str) -> Lease | None:
    try:
        return kube.get(Lease, LEASE_NAME, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


def test_the_operator_deletes_its_lease_when_it_stops_with_nothing_left_to_lead(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    fake_nodes("dgx-h100:1")
    cluster_policies({})
    # A rollout with a ClusterPolicy in place: the Lease is released (no holder), not deleted.
    first = start_operator(leader_elect=True)
    reconciled(kube, context=first.log_text)
    assert first.stop() == 0
    released = lease(kube, operator_namespace)
    assert released is not None and released.spec is not None and not released.spec.holderIdentity
    # An uninstall: the pre-delete hook deletes the ClusterPolicy, then Helm stops the operator.
    second = start_operator(leader_elect=True)
    wait_for(
        "the second replica holding the Lease",
        lambda: lease(kube, operator_namespace),
        until=lambda got: got is not None and got.spec is not None and bool(got.spec.holderIdentity),
        timeout=60,
        context=second.log_text,
    )
    assert "deleted ClusterPolicy cluster-policy" in cleanup_command(control_plane)
    assert second.stop() == 0
    assert lease(kube, operator_namespace) is None, second.log_text()[-2000:]
    assert "deleted lease" in second.log_text()


@pytest.fixture
def our_crds_restored(kube: Client, crds: list[str]) -> Iterator[list[str]]:
    """Our CRDs, applied again after the test (later tests of the session need them). NFD's
    NodeFeature CRD, which `apply_crds` creates where absent, is not ours: cleanup leaves it."""
    yield [name for name in crds if name != NODE_FEATURE_CRD]
    assert _crd_exists(kube, NODE_FEATURE_CRD)  # whatever the test deleted, never NFD's kind
    for name in crds:
        wait_for(
            f"CRD {name} gone or kept",
            functools.partial(_crd_terminating, kube, name),
            until=lambda terminating: not terminating,
            timeout=60,
        )
    apply_crds(kube)
    # Established is not yet served: the apiserver answers 429 for a recreated CRD's resources for
    # a moment, and the next test's first list would fail on it.
    for resource in (ClusterPolicyResource, NVIDIADriverResource, GPUClusterResource):
        wait_for(f"{resource.__name__} served again", functools.partial(_served, kube, resource), timeout=60)


def _served(kube: Client, resource: Any) -> bool:
    try:
        list(kube.list(resource))
    except ApiError as err:
        if err.status.code in (404, 429):  # not in discovery yet; storage (re)initializing
            return False
        raise
    return True


def _crd_terminating(kube: Client, name: str) -> bool:
    try:
        crd = kube.get(CustomResourceDefinition, name)
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return crd.metadata is not None and crd.metadata.deletionTimestamp is not None


def test_cleanup_uncordons_only_the_nodes_a_driver_upgrade_cordoned_and_deletes_our_crds_when_asked(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    our_crds_restored: list[str],
) -> None:
    ours, user_before, user_waiting, plain = fake_nodes("dgx-h100:4")
    # (not the cluster_policies fixture: its teardown would find the CRD gone)
    kube.create(
        ClusterPolicyResource(
            apiVersion="nvidia.com/v1",
            kind="ClusterPolicy",
            metadata=ObjectMeta(name="cluster-policy"),
            spec={},
        )
    )
    # The upgrade controller's marks, written under its field manager, as it leaves them when the
    # uninstall comes in the middle of an upgrade (no operator runs here: the hook's work alone).
    as_operator = Client(config=kube.config, field_manager=FIELD_MANAGER)
    marks = {
        ours: (WAIT_FOR_JOBS_REQUIRED, {}),  # cordoned by the upgrade
        user_before: (POD_DELETION_REQUIRED, {UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: "true"}),  # a user's
        user_waiting: (UPGRADE_REQUIRED, {}),  # a user cordoned it while it waited for a slot
    }
    for node, (state, notes) in marks.items():
        as_operator.patch(
            Node,
            node,
            {
                "metadata": {"labels": {UPGRADE_STATE: state}, "annotations": notes},
                "spec": {"unschedulable": True},
            },
        )
    out = cleanup_command(control_plane, "--crds")

    def cordoned(node: str) -> bool:
        found = kube.get(Node, node)
        return bool(found.spec and found.spec.unschedulable)

    assert not cordoned(ours), out
    assert cordoned(user_before) and cordoned(user_waiting) and not cordoned(plain)
    assert f"node {ours}: uncordoned" in out and f"node {user_before}: uncordoned" not in out
    for node in marks:
        labels = kube.get(Node, node).metadata.labels or {}
        assert UPGRADE_STATE not in labels, (node, labels)
    for name in our_crds_restored:
        assert f"deleted CRD {name}" in out
        wait_for(
            f"CRD {name} deleted",
            functools.partial(_crd_exists, kube, name),
            until=lambda left: not left,
            timeout=60,
        )
    for node in (user_before, user_waiting):  # the user's cordons are theirs to lift
        kube.patch(Node, node, {"spec": {"unschedulable": False}})


def _crd_exists(kube: Client, name: str) -> bool:
    try:
        kube.get(CustomResourceDefinition, name)
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return True


def _operator_deployment(namespace: str, node: str) -> Deployment:
    labels = {"app": "gpu-operator"}
    return Deployment(
        metadata=ObjectMeta(name="gpu-operator", namespace=namespace),
        spec=DeploymentSpec(
            replicas=1,
            selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(
                metadata=ObjectMeta(labels=labels),
                spec=PodSpec(
                    nodeSelector={"kubernetes.io/hostname": node},
                    containers=[Container(name="gpu-operator", image="gpu-operator:test")],
                ),
            ),
        ),
    )


def _held_lease(namespace: str, holder: str) -> Lease:
    now = dt.datetime.now(dt.UTC)
    return Lease(
        metadata=ObjectMeta(name=LEASE_NAME, namespace=namespace),
        spec=LeaseSpec(holderIdentity=holder, leaseDurationSeconds=15, acquireTime=now, renewTime=now),
    )


def test_cleanup_stops_the_operator_deployment_before_helm_deletes_its_rbac(
    kube: Client, control_plane: ControlPlane, fake_nodes: Callable[..., list[str]], namespace: str
) -> None:
    (node,) = fake_nodes("cpu:1")
    kube.create(_operator_deployment(namespace, node))
    wait_for(
        "the operator pod Running",
        lambda: [p for p in kube.list(Pod, namespace=namespace) if p.status and p.status.phase == "Running"],
        timeout=60,
    )
    # A holder that cannot delete its Lease on the way out (a kwok pod runs nothing): the hook does.
    kube.create(_held_lease(namespace, "gpu-operator-abc_1234"))
    out = cleanup_command(control_plane, "--operator-deployment", "gpu-operator", "--namespace", namespace)
    assert f"scaled Deployment {namespace}/gpu-operator to 0" in out.splitlines(), out
    spec = kube.get(Deployment, "gpu-operator", namespace=namespace).spec
    assert spec is not None and spec.replicas == 0
    assert list(kube.list(Pod, namespace=namespace)) == []  # waited for: no operator pod left
    assert lease(kube, namespace) is None, out
    # Run again (a retried hook): nothing to scale, nothing to delete, no error.
    again = cleanup_command(control_plane, "--operator-deployment", "gpu-operator", "--namespace", namespace)
    assert "scaled Deployment" not in again and "deleted Lease" not in again, again


def test_cleanup_keeps_a_lease_held_by_an_operator_it_did_not_stop(
    kube: Client, control_plane: ControlPlane, namespace: str
) -> None:
    kube.create(_held_lease(namespace, "elsewhere_5678"))  # e.g. an operator run outside the chart
    out = cleanup_command(control_plane, "--operator-deployment", "gpu-operator", "--namespace", namespace)
    assert (
        f"kept Lease {namespace}/{LEASE_NAME}: held by elsewhere_5678 and no Deployment gpu-operator to stop"
        in out.splitlines()
    ), out
    found = lease(kube, namespace)
    assert found is not None and found.spec is not None and found.spec.holderIdentity == "elsewhere_5678"


def test_cleanup_crds_keeps_a_crd_whose_objects_remain(
    kube: Client, control_plane: ControlPlane, namespace: str, our_crds_restored: list[str]
) -> None:
    """A user's ComputeDomains (namespaced, counted across namespaces from a one-item list) keep
    their CRD; the CRDs without objects go."""
    base = f"/apis/resource.nvidia.com/v1beta1/namespaces/{namespace}/computedomains"
    for name in ("imex-a", "imex-b"):
        control_plane.request(
            "POST",
            base,
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "metadata": {"name": name},
                "spec": {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
            },
        )
    kept = "computedomains.resource.nvidia.com"
    out = cleanup_command(control_plane, "--crds")
    assert f"kept CRD {kept}: 2 object(s) of it still exist" in out, out
    assert _crd_exists(kube, kept)
    for name in set(our_crds_restored) - {kept}:
        assert f"deleted CRD {name}" in out, out
    for name in ("imex-a", "imex-b"):
        control_plane.request("DELETE", f"{base}/{name}")
