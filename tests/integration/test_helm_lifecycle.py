"""The chart's release lifecycle with the helm command line, Helm 3 and Helm 4, the same arguments
for both: install, upgrade with a changed value, rollback to the first revision, uninstall, against
the real apiserver. kwok completes the hook Jobs' pods, so each hook's Job must be created, finish
and be deleted (hook-succeeded) for helm to go on; the audit log shows which hook Jobs each step
created: the CRD hook on install and upgrade (pre-install,pre-upgrade), none on rollback (the
chart has no pre-rollback hook), the cleanup hook on uninstall (pre-delete)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import packaged_chart
from tests.support.audit import status_code
from tests.support.chart import helm_on_kwok, real_nodes_cordoned
from tests.support.cleanup import delete_if_present
from tests.support.events import namespace_story
from tests.support.helm_cli import MAJORS, HelmCLI, HelmFailed
from tests.support.waiting import wait_for

NAMESPACE = "gpu-operator-lifecycle"
RELEASE = "gpu-operator"
CREATED = 201


def _leave_no_release_behind(kube: Client) -> None:
    """What an uninstall keeps (the ClusterPolicy: helm.sh/resource-policy keep) and the namespace."""
    delete_if_present(kube, ClusterPolicyResource, "cluster-policy")
    delete_if_present(kube, Namespace, NAMESPACE)
    wait_for(
        "the namespace gone",
        lambda: [n for n in kube.list(Namespace) if n.metadata.name == NAMESPACE],
        until=lambda left: not left,
        timeout=120,
    )


@pytest.fixture(params=MAJORS, ids=[f"helm{m}" for m in MAJORS])
def helm(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    kube: Client,
    crds: list[str],
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> Iterator[HelmCLI]:
    fake_nodes("cpu:1")  # kwok completes the hook Jobs' pods there (any real node cordoned meanwhile)
    with helm_on_kwok(request.param, control_plane, kube, NAMESPACE, tmp_path / "helm") as cli:
        assert cli.version().startswith(f"v{request.param}."), cli.version()
        try:
            yield cli
        finally:
            if RELEASE in cli.releases():
                cli.uninstall(RELEASE)
            _leave_no_release_behind(kube)


def hook_jobs_created(plane: ControlPlane) -> list[str]:
    """The Jobs created in the release's namespace so far, in order, read from the audit log: a
    `create` (Helm 3) or a server-side apply that created the object (Helm 4: `patch`, 201)."""
    return [
        e["objectRef"]["name"]
        for e in plane.audit_events()
        if e.get("stage") == "ResponseComplete"
        and e.get("verb") in ("create", "patch")
        and e.get("objectRef", {}).get("resource") == "jobs"
        and e["objectRef"].get("namespace") == NAMESPACE
        and status_code(e) == CREATED
    ]


def log_level(kube: Client) -> str:
    args = (
        kube.get(Deployment, "gpu-operator", namespace=NAMESPACE).spec.template.spec.containers[0].args or []
    )
    return str(args[args.index("--log-level") + 1])


def helm_writes(kube: Client) -> set[tuple[str, str]]:
    """How helm wrote the operator Deployment: (field manager, operation) of its managedFields."""
    fields = kube.get(Deployment, "gpu-operator", namespace=NAMESPACE).metadata.managedFields or []
    return {(str(f.manager), str(f.operation)) for f in fields if f.manager == "helm"}


def test_install_upgrade_rollback_uninstall(
    helm: HelmCLI, control_plane: ControlPlane, kube: Client, tmp_path: Path
) -> None:
    chart = packaged_chart(tmp_path / "chart")
    seen = hook_jobs_created(control_plane)  # the namespace's earlier runs (the other helm major)

    def new_hook_jobs() -> list[str]:
        now = hook_jobs_created(control_plane)
        added = now[len(seen) :]
        seen[:] = now
        return added

    def no_hook_job_left() -> None:  # hook-delete-policy hook-succeeded
        assert [j.metadata.name for j in kube.list(Job, namespace=NAMESPACE)] == []

    helm.install(chart, RELEASE, {"nfd": {"enabled": False}})
    assert new_hook_jobs() == ["gpu-operator-crds"]
    no_hook_job_left()
    assert log_level(kube) == "info"
    # Helm 4 installs with server-side apply (`--server-side` defaults to true), Helm 3 client-side
    assert helm_writes(kube) == {("helm", "Apply" if helm.major == 4 else "Update")}

    helm.upgrade(chart, RELEASE, {"operator": {"logging": {"level": "debug"}}})
    assert new_hook_jobs() == ["gpu-operator-crds"]
    no_hook_job_left()
    assert log_level(kube) == "debug"

    helm.rollback(RELEASE, 1)
    assert new_hook_jobs() == []
    assert log_level(kube) == "info"
    history = helm.history(RELEASE)
    assert [(h["revision"], h["status"]) for h in history] == [
        (1, "superseded"),
        (2, "superseded"),
        (3, "deployed"),
    ]
    assert history[-1]["description"] == "Rollback to 1"

    helm.uninstall(RELEASE)
    assert new_hook_jobs() == ["gpu-operator-cleanup"]
    assert RELEASE not in helm.releases()
    wait_for(
        "the operator Deployment gone",
        lambda: list(kube.list(Deployment, namespace=NAMESPACE)),
        until=lambda left: left == [],
        timeout=60,
    )


def driver_version(kube: Client) -> str:
    return str(kube.get(ClusterPolicyResource, "cluster-policy").spec["driver"]["version"])


def test_upgrade_after_a_field_was_changed_by_hand(helm: HelmCLI, kube: Client, tmp_path: Path) -> None:
    """`helm upgrade` after someone edited a field the chart sets (the ClusterPolicy's driver
    version, as `kubectl edit` would), the chart's value for it unchanged: Helm 3's three-way merge
    patches only what changed between the chart's revisions, so the hand-set value stays and the
    upgrade succeeds; Helm 4's server-side apply refuses (the revision fails, the hand-set value
    stays) until `--force-conflicts`, which writes the chart's value back."""
    chart = packaged_chart(tmp_path / "chart")
    helm.install(chart, RELEASE, {"nfd": {"enabled": False}})
    ours = driver_version(kube)
    kube.patch(
        ClusterPolicyResource,
        "cluster-policy",
        {"spec": {"driver": {"version": "580.95.05"}}},
        patch_type=PatchType.MERGE,
        field_manager="kubectl-edit",
    )
    if helm.major == 4:
        with pytest.raises(HelmFailed):
            helm.upgrade(chart, RELEASE, {})
        assert [(h["revision"], h["status"]) for h in helm.history(RELEASE)] == [
            (1, "deployed"),
            (2, "failed"),
        ]
        assert driver_version(kube) == "580.95.05"
        helm.upgrade(chart, RELEASE, {}, "--force-conflicts")
        assert driver_version(kube) == ours
    else:
        helm.upgrade(chart, RELEASE, {})
        assert driver_version(kube) == "580.95.05"
    assert helm.history(RELEASE)[-1]["status"] == "deployed"


@pytest.fixture
def helm3_then_4(
    control_plane: ControlPlane,
    kube: Client,
    crds: list[str],
    fake_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> Iterator[tuple[HelmCLI, HelmCLI]]:
    fake_nodes("cpu:1")
    kubeconfig = control_plane.admin_kubeconfig
    helm3, helm4 = (
        HelmCLI(
            m, kubeconfig, NAMESPACE, tmp_path / f"helm{m}", story=lambda: namespace_story(kube, NAMESPACE)
        )
        for m in (3, 4)
    )
    with real_nodes_cordoned(kube):
        try:
            yield helm3, helm4
        finally:
            if RELEASE in helm4.releases():
                helm4.uninstall(RELEASE)
            _leave_no_release_behind(kube)


def test_a_helm_3_release_taken_on_by_helm_4(
    helm3_then_4: tuple[HelmCLI, HelmCLI], control_plane: ControlPlane, kube: Client, tmp_path: Path
) -> None:
    """A user moving to Helm 4: the release Helm 3 installed upgrades, rolls back and uninstalls
    with Helm 4, hooks included; Helm 4 keeps applying it client-side (`--server-side=auto` takes
    the previous revision's method)."""
    helm3, helm4 = helm3_then_4
    chart = packaged_chart(tmp_path / "chart")
    seen = hook_jobs_created(control_plane)
    helm3.install(chart, RELEASE, {"nfd": {"enabled": False}})
    helm4.upgrade(chart, RELEASE, {"operator": {"logging": {"level": "debug"}}})
    assert log_level(kube) == "debug"
    assert helm_writes(kube) == {("helm", "Update")}
    helm4.rollback(RELEASE, 1)
    assert log_level(kube) == "info"
    assert [(h["revision"], h["status"]) for h in helm4.history(RELEASE)][-1] == (3, "deployed")
    helm4.uninstall(RELEASE)
    assert hook_jobs_created(control_plane)[len(seen) :] == [
        "gpu-operator-crds",
        "gpu-operator-crds",
        "gpu-operator-cleanup",
    ]
    assert RELEASE not in helm4.releases()
