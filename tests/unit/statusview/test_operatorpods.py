"""`gpu-operator status` on the chart's own pods: an operator or hook pod that cannot pull its
image is reported with the values keys that build the image, and keeps the view not ready."""

from __future__ import annotations

from typing import Any

from gpu_operator.statusview.operatorpods import operator_problems
from gpu_operator.statusview.table import build_view


def chart_pod(
    name: str,
    component: str,
    *,
    waiting: tuple[str, str] | None = None,
    phase: str = "Pending",
    image: str = "registry.example/gpu-operator:nosuch",
) -> dict[str, Any]:
    state: dict[str, Any] = (
        {"waiting": {"reason": waiting[0], "message": waiting[1]}} if waiting else {"running": {}}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "gpu-operator",
            "labels": {"app.kubernetes.io/component": component},
        },
        "spec": {"containers": [{"name": "main", "image": image}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "main", "state": state}]},
    }


def ready_policy() -> dict[str, Any]:
    return {
        "metadata": {"name": "cluster-policy", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {
            "state": "ready",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}],
        },
    }


def test_an_operator_pod_that_cannot_pull_names_the_image_and_the_values_keys() -> None:
    pods = [
        chart_pod(
            "gpu-operator-7d9-abcde",
            "gpu-operator",
            waiting=("ImagePullBackOff", 'Back-off pulling image "registry.example/gpu-operator:nosuch"'),
        )
    ]
    [line] = operator_problems(pods)
    assert line.startswith(
        "the operator: pod gpu-operator/gpu-operator-7d9-abcde cannot pull image "
        "'registry.example/gpu-operator:nosuch' (ImagePullBackOff)"
    )
    assert "operator.repository, operator.image and operator.version" in line
    assert "helm uninstall --no-hooks" in line


def test_a_pod_pulling_with_a_secret_names_it_the_values_key_and_the_registry() -> None:
    pod = chart_pod(
        "gpu-operator-crds-x1",
        "crds",
        waiting=("ErrImagePull", "401 Unauthorized"),
        image="127.0.0.1:5000/gpu-operator-py/gpu-operator:0.1.0",
    )
    pod["spec"]["imagePullSecrets"] = [{"name": "registry-creds"}]
    [line] = operator_problems([pod])
    assert line.startswith(
        "the CRD hook Job (helm install/upgrade waits for it): pod gpu-operator/gpu-operator-crds-x1 "
        "cannot pull image '127.0.0.1:5000/gpu-operator-py/gpu-operator:0.1.0' (ErrImagePull); "
        "it pulls with the Secret registry-creds (operator.imagePullSecrets): check that it holds "
        "valid credentials for 127.0.0.1:5000; the chart builds it from"
    )
    # without a host in the reference the image comes from Docker Hub
    pod["spec"]["containers"][0]["image"] = "nvidia/gpu-operator:v1"
    [line] = operator_problems([pod])
    assert "valid credentials for docker.io;" in line


def test_each_hook_job_is_named_for_what_waits_on_it() -> None:
    pods = [
        chart_pod("gpu-operator-crds-x1", "crds", waiting=("ErrImagePull", "not found")),
        chart_pod("gpu-operator-cleanup-y2", "cleanup", waiting=("InvalidImageName", "bad reference")),
    ]
    lines = operator_problems(pods)
    assert lines[0].startswith(
        "the CRD hook Job (helm install/upgrade waits for it): pod gpu-operator/gpu-operator-crds-x1"
        " cannot pull image"
    )
    assert lines[1].startswith(
        "the uninstall cleanup Job (helm uninstall waits for it): pod "
        "gpu-operator/gpu-operator-cleanup-y2 cannot pull image"
    )


def test_the_crd_hook_names_the_command_that_recovers_its_release() -> None:
    """Fixed in place, the Secret serves the kubelet's next pull (at most 300 s away) while helm
    waits; after helm failed, `helm upgrade --install` of the release named by the pod's label."""
    pod = chart_pod("gpu-operator-crds-x1", "crds", waiting=("ImagePullBackOff", "401 Unauthorized"))
    pod["metadata"]["labels"]["app.kubernetes.io/instance"] = "my-gpus"
    [line] = operator_problems([pod])
    assert line.endswith(
        "operator.version (operator.imagePullSecrets for a private registry): a Secret fixed in place (same name) "
        "is used at the kubelet's next pull, within 300 s, while helm still waits; once helm has failed, run "
        "`helm upgrade --install my-gpus CHART --namespace gpu-operator` with the fixed values, or "
        "`helm uninstall --no-hooks` and `gpu-operator cleanup` to give the release up"
    )
    del pod["metadata"]["labels"]["app.kubernetes.io/instance"]  # an older chart's pod: a placeholder
    [line] = operator_problems([pod])
    assert "`helm upgrade --install RELEASE CHART --namespace gpu-operator`" in line
    cleanup = chart_pod("gpu-operator-cleanup-y2", "cleanup", waiting=("ErrImagePull", "401 Unauthorized"))
    [line] = operator_problems([cleanup])
    assert line.endswith(
        ": fix them and `helm uninstall` again, or `helm uninstall --no-hooks` and "
        "`gpu-operator cleanup` if the release cannot run its own hooks"
    )


def test_running_finished_and_foreign_pods_are_no_problem() -> None:
    pods = [
        chart_pod("gpu-operator-7d9-abcde", "gpu-operator", phase="Running"),
        chart_pod("gpu-operator-crds-x1", "crds", phase="Succeeded"),
        chart_pod("someone-else", "web", waiting=("ImagePullBackOff", "not ours")),
    ]
    assert operator_problems(pods) == []


def test_another_wait_reason_is_reported_with_its_message() -> None:
    pods = [
        chart_pod(
            "gpu-operator-7d9-abcde",
            "gpu-operator",
            phase="Running",
            waiting=("CrashLoopBackOff", "back-off 5m0s restarting failed container"),
        )
    ]
    assert operator_problems(pods) == [
        "the operator: pod gpu-operator/gpu-operator-7d9-abcde, container main: "
        "CrashLoopBackOff: back-off 5m0s restarting failed container"
    ]


def test_the_view_is_not_ready_and_lists_the_operator_first() -> None:
    stuck = chart_pod("gpu-operator-7d9-abcde", "gpu-operator", waiting=("ImagePullBackOff", ""))
    healthy = build_view([], [], [], [ready_policy()], "gpu-operator", operator_pods=[])
    assert healthy.ready
    view = build_view([], [], [], [ready_policy()], "gpu-operator", operator_pods=[stuck])
    assert view.operator and view.problems[0] == view.operator[0]
    assert not view.ready
    assert view.problems[1:] == healthy.problems
