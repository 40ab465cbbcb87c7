"""Clean uninstall on the real control plane: after `helm uninstall` (the helm command line, Helm 3
and Helm 4 with the same arguments: tests/support/helm_cli.py) or
after deleting the ClusterPolicy, every node carries exactly the nvidia.com/ labels and annotations,
and the taints, it had before the operator came, and no object we created is left, of any kind.

kwok stands in for the kubelet, so no container runs: the operator runs as a process with the
chart's ServiceAccount (as in test_chart_rbac.py), and the chart's pre-delete hook command (taken
from the rendered Job) runs as a process with the hook's own ServiceAccount and RBAC, applied as
Helm applies them; `helm uninstall` then runs the hook Job (kwok completes it) and deletes the
release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Secret

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import packaged_chart
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import GPU_PRESENT, HEALTH_REQUESTS_SECRET, MANAGED_SELECTOR, NVIDIA
from tests.support.chart import helm_on_kwok, objects, render_chart
from tests.support.cleanup import delete_if_present
from tests.support.helm_cli import MAJORS, HelmCLI
from tests.support.owned import owned_by
from tests.support.status import reconciled
from tests.support.waiting import wait_for

NAMESPACE = "gpu-operator-uninstall"
RELEASE = "gpu-operator"
Marks = dict[str, Any]


CONDITION_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def marks(kube: Client) -> dict[str, Marks]:
    """Per node: its nvidia.com/ labels and annotations, whether it is cordoned, and its taints
    except the node lifecycle controller's condition taints (not-ready, unreachable: they follow
    the node's Ready condition, and a kwok node just made Ready still carries not-ready for a
    moment); other keys come and go with the control plane's own controllers too."""

    def ours(found: dict[str, str] | None) -> dict[str, str]:
        return {k: v for k, v in (found or {}).items() if k.startswith(f"{NVIDIA}/")}

    return {
        str(n.metadata.name): {
            "labels": ours(n.metadata.labels),
            "annotations": ours(n.metadata.annotations),
            "unschedulable": bool(n.spec.unschedulable),
            "taints": sorted(
                (t.key, t.value, t.effect) for t in (n.spec.taints or []) if t.key not in CONDITION_TAINTS
            ),
        }
        for n in kube.list(Node)
    }


def differences(before: dict[str, Marks], now: dict[str, Marks]) -> list[str]:
    out = []
    for node, was in before.items():
        is_ = now.get(node)
        if is_ is None:
            continue
        for part in ("labels", "annotations"):
            added = {k: v for k, v in is_[part].items() if was[part].get(k) != v}
            removed = sorted(set(was[part]) - set(is_[part]))
            if added or removed:
                out.append(f"{node} {part}: +{added} -{removed}")
        for part in ("taints", "unschedulable"):
            if was[part] != is_[part]:
                out.append(f"{node} {part}: {was[part]} -> {is_[part]}")
    return out


def ours_left(control_plane: ControlPlane) -> list[str]:
    """Objects of every listable kind that carry our managed-by label (CRDs aside: Helm keeps
    what crds/ installed), plus any ClusterPolicy or NVIDIADriver."""
    found = []
    selector = urllib.parse.quote(MANAGED_SELECTOR)
    groups = [("", "v1")] + [
        (g["name"], g["preferredVersion"]["groupVersion"])
        for g in control_plane.request("GET", "/apis")["groups"]
    ]
    for group, version in groups:
        base = "/api/v1" if not group else f"/apis/{version}"
        for res in control_plane.request("GET", base)["resources"]:
            if (
                "/" in res["name"]
                or "list" not in res.get("verbs", [])
                or res["kind"] == "CustomResourceDefinition"
            ):
                continue
            if group == "nvidia.com":
                items = control_plane.request("GET", f"{base}/{res['name']}")["items"]
            else:
                items = control_plane.request("GET", f"{base}/{res['name']}?labelSelector={selector}")[
                    "items"
                ]
            found += [
                f"{res['kind']} {i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items
            ]
    return sorted(found)


def _gpu_nodes_labelled(kube: Client, names: list[str]) -> bool:
    return all((kube.get(Node, n).metadata.labels or {}).get(GPU_PRESENT) == "true" for n in names)


@pytest.fixture(params=MAJORS, ids=[f"helm{m}" for m in MAJORS])
def helm(
    request: pytest.FixtureRequest, control_plane: ControlPlane, kube: Client, tmp_path: Path
) -> Iterator[HelmCLI]:
    """The helm command line of one major for the release namespace, with any real node cordoned
    (tests/support/chart.py's real_nodes_cordoned: the hook Job's pod must go to a kwok node).
    Afterwards a release a failed test left is removed without its hooks, so that its cluster-wide
    objects (ClusterRoles, ...) do not meet the next module, and the namespace is deleted."""
    with helm_on_kwok(request.param, control_plane, kube, NAMESPACE, tmp_path / "helm") as cli:
        try:
            yield cli
        finally:
            if RELEASE in cli.releases():
                cli.run("uninstall", RELEASE, "--no-hooks", "--timeout", "120s", timeout=180)
            delete_if_present(kube, Namespace, NAMESPACE)
            # gone before the next run (the other helm major) creates it again
            wait_for(
                "the namespace gone",
                lambda: [n for n in kube.list(Namespace) if n.metadata.name == NAMESPACE],
                until=lambda left: not left,
                timeout=120,
            )


def test_helm_uninstall_leaves_no_trace(
    control_plane: ControlPlane,
    kube: Client,
    crds: list[str],
    fake_nodes: Callable[..., list[str]],
    helm: HelmCLI,
    tmp_path: Path,
) -> None:
    gpu_nodes = fake_nodes("dgx-h100:2", "host-driver:1")
    fake_nodes("cpu:1")
    before = marks(kube)
    values = {"nfd": {"enabled": False}}
    helm.install(packaged_chart(tmp_path / "chart"), RELEASE, values)
    operator = OperatorProcess(
        kubeconfig=control_plane.serviceaccount_kubeconfig(NAMESPACE, "gpu-operator", create=False),
        namespace=NAMESPACE,
        log=tmp_path / "operator.log",
    ).start()
    try:
        reconciled(kube, "cluster-policy", context=operator.log_text)
        uid = kube.get(ClusterPolicyResource, "cluster-policy").metadata.uid
        wait_for(
            "GPU nodes labelled", lambda: _gpu_nodes_labelled(kube, gpu_nodes), context=operator.log_text
        )
        assert differences(before, marks(kube)), "the operator wrote nothing on the nodes: nothing to clean"
        assert owned_by(kube, uid), "the operator created nothing: nothing to clean"

        # The operator stops first (a crash-looping one at uninstall time), so what follows is the
        # hook's work alone. The pre-delete hook, as Helm creates it; its command runs with its
        # own identity.
        operator.stop()
        # GPU health's requests Secret as a remediation leaves it (the operator makes it, not Helm)
        kube.create(
            Secret(
                metadata=ObjectMeta(name=HEALTH_REQUESTS_SECRET, namespace=NAMESPACE), stringData={"n1": "{}"}
            )
        )
        hook = [
            o
            for o in objects(render_chart(values, namespace=NAMESPACE))
            if o["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"
        ]
        job = next(o for o in hook if o["kind"] == "Job")
        for obj in hook:
            if obj["kind"] != "Job":
                kube.apply(from_dict(obj), force=True)
        hook_config = control_plane.serviceaccount_kubeconfig(
            NAMESPACE, job["spec"]["template"]["spec"]["serviceAccountName"], create=False
        )
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[0] == "gpu-operator"
        cli = str(Path(sys.executable).parent / "gpu-operator")
        env = {**os.environ, "OPERATOR_NAMESPACE": NAMESPACE}  # the Job's fieldRef to its namespace
        done = subprocess.run(
            [cli, *command[1:], "--kubeconfig", str(hook_config)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "deleted ClusterPolicy cluster-policy" in done.stdout, done.stdout
        with pytest.raises(ApiError) as gone:
            kube.get(Secret, HEALTH_REQUESTS_SECRET, namespace=NAMESPACE)
        assert gone.value.status.code == 404, "the hook left GPU health's requests Secret"
        assert differences(before, marks(kube)) == [], "the hook left labels behind"

        helm.uninstall(RELEASE)
    finally:
        operator.stop()
        print(f"--- {operator.log} ---\n{operator.log_text()[-4000:]}")
    wait_for(
        "every node as it was before the install",
        lambda: differences(before, marks(kube)),
        until=lambda diff: not diff,
        timeout=60,
    )
    wait_for(
        "no object owned by the ClusterPolicy",
        lambda: owned_by(kube, uid),
        until=lambda o: not o,
        timeout=120,
    )
    wait_for(
        "no object of any kind marked as ours",
        lambda: ours_left(control_plane),
        until=lambda o: not o,
        timeout=60,
    )
    assert RELEASE not in helm.releases()  # the release is gone


def test_deleting_the_clusterpolicy_takes_back_our_node_labels(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
) -> None:
    gpu_nodes = fake_nodes("dgx-h100:2", "vfio-passthrough:1")
    names = set(gpu_nodes)
    # A user's own label and a user's choice to keep the driver off one node must survive.
    kube.patch(
        Node,
        gpu_nodes[0],
        {"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "false", "nvidia.com/team": "ml"}}},
    )
    before = {n: m for n, m in marks(kube).items() if n in names}
    operator = start_operator()
    name = cluster_policies({})
    reconciled(kube, name, context=operator.log_text)
    wait_for("GPU nodes labelled", lambda: _gpu_nodes_labelled(kube, gpu_nodes), context=operator.log_text)
    uid = kube.get(ClusterPolicyResource, name).metadata.uid
    assert differences(before, marks(kube))

    kube.delete(ClusterPolicyResource, name)
    wait_for(
        "every node as it was before the ClusterPolicy",
        lambda: differences(before, marks(kube)),
        until=lambda diff: not diff,
        timeout=60,
        context=operator.log_text,
    )
    wait_for(
        "no object owned by the ClusterPolicy",
        lambda: owned_by(kube, uid),
        until=lambda o: not o,
        timeout=120,
    )
    labels = kube.get(Node, gpu_nodes[0]).metadata.labels or {}
    assert labels.get("nvidia.com/gpu.deploy.driver") == "false" and labels.get("nvidia.com/team") == "ml"
    assert operator.alive
    assert not list(kube.list(NVIDIADriverResource))
