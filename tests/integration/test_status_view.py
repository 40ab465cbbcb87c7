"""`gpu-operator status` against the real control plane, before and after the operator reconciled."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from lightkube import Client

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.statusview.collect import collect
from tests.support.waiting import wait_for

# The default policy's operands on a dgx-h100 node (MPS and the disabled exporter select none).
RUNNING = [
    "driver",
    "container-toolkit",
    "operator-validator",
    "device-plugin",
    "gpu-feature-discovery",
    "dcgm",
    "dcgm-exporter",
    "mig-manager",
]


def status_cli(plane: ControlPlane, namespace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "status",
            f"--kubeconfig={plane.admin_kubeconfig}",
            f"--namespace={namespace}",
            "--max-nodes=100",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_view_before_and_after_the_operator(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    names = fake_nodes("dgx-h100:2")
    cpu = fake_nodes("cpu:1")[0]
    cluster_policies({})

    before = collect(kube, operator_namespace)
    assert not before.ready
    assert "ClusterPolicy cluster-policy: not reconciled yet" in before.problems
    result = status_cli(control_plane, operator_namespace)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not reconciled yet" in result.stdout

    operator = start_operator()
    view = wait_for(
        "the status view to be ready",
        lambda: (v := collect(kube, operator_namespace)).ready and v,
        timeout=150,
        context=operator.log_text,
    )
    rows = {row.name: row for row in view.rows}
    assert set(names) <= set(rows) and cpu not in rows
    for name in names:
        row = rows[name]
        for component in RUNNING:
            cell = row.cells[component]
            assert (cell.label, cell.pod, cell.ready) == ("true", "Running", True), (name, component, cell)
        assert row.validation.startswith("passed"), row.validation
        assert row.cells["node-status-exporter"].expected is False  # disabled by default: label only
    assert view.policy is not None and (view.policy.state, view.policy.reason) == ("ready", "Reconciled")

    result = status_cli(control_plane, operator_namespace)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ClusterPolicy cluster-policy: ready (Reconciled)" in result.stdout
    assert all(name in result.stdout for name in names) and "Everything is ready." in result.stdout
    # Without --namespace the view finds the operands through the policy's status.namespace.
    assert collect(kube).namespace == operator_namespace


def test_an_operator_pod_that_cannot_pull_its_image_is_reported_with_the_values_keys(
    kube: Client, operator_namespace: str
) -> None:
    """Without --namespace (an operator that never started wrote no status to say where it is):
    the view finds the chart's pods in every namespace and says which values build the image it
    cannot pull."""
    from lightkube.codecs import from_dict
    from lightkube.resources.core_v1 import Pod

    name = "gpu-operator-5c8d9-pull"
    image = "registry.invalid/gpu-operator:nosuch"
    kube.create(
        from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": operator_namespace,
                    "labels": {"app": "gpu-operator", "app.kubernetes.io/component": "gpu-operator"},
                },
                # held out of scheduling: no kwok node plays it, so its status is what the kubelet would report
                "spec": {
                    "schedulingGates": [{"name": "example.com/held"}],
                    "containers": [{"name": "gpu-operator", "image": image}],
                },
            }
        )
    )
    try:
        kube.patch(
            Pod.Status,
            name,
            {
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "name": "gpu-operator",
                            "image": image,
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": f'Back-off pulling image "{image}"',
                                }
                            },
                        }
                    ],
                }
            },
            namespace=operator_namespace,
        )
        view = collect(kube)
        line = next(p for p in view.problems if name in p)
        assert line.startswith(
            f"the operator: pod {operator_namespace}/{name} cannot pull image '{image}' (ImagePullBackOff)"
        ), line
        assert "operator.repository, operator.image and operator.version" in line
        assert not view.ready
    finally:
        kube.delete(Pod, name, namespace=operator_namespace, grace_period=0)
