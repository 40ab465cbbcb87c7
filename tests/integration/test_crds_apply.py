"""`gpu-operator crds apply` (the Helm hook's command) against the real apiserver: idempotent, and a
CRD another Helm release owns is left to it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from gpu_operator.kube.crdowners import (
    HELM_MANAGED_BY_LABEL,
    HELM_RELEASE_NAME,
    HELM_RELEASE_NAMESPACE,
    LeftCRD,
    Release,
)
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.statusview.collect import collect


def test_crds_apply_twice(control_plane: ControlPlane) -> None:
    argv = [
        sys.executable,
        "-m",
        "gpu_operator.cli",
        "crds",
        "apply",
        f"--kubeconfig={control_plane.admin_kubeconfig}",
    ]
    for run in range(2):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert "applied clusterpolicies.nvidia.com (Established)" in done.stdout
        assert "applied nvidiadrivers.nvidia.com (Established)" in done.stdout
        assert "applied gpuclusters.nvidia.com (Established)" in done.stdout
        # NFD's kind: created where absent; once it exists (the second run at the latest) never
        # changed, and said so
        lines = done.stdout.splitlines()
        left = "left nodefeatures.nfd.k8s-sigs.io as it was (it exists; Established)"
        assert (
            left in lines
            if run
            else (left in lines or "applied nodefeatures.nfd.k8s-sigs.io (Established)" in lines)
        )
    served = control_plane.request("GET", "/apis/nvidia.com/v1")
    assert any(r["name"] == "clusterpolicies" for r in served["resources"])


def _create(plane: ControlPlane, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    try:
        return 201, plane.request("POST", "/apis/nvidia.com/v1alpha1/gpuclusters", body)
    except urllib.error.HTTPError as err:
        status: dict[str, Any] = json.loads(err.read() or b"{}")
        return err.code, status


def test_the_apiserver_holds_the_gpucluster_schema(control_plane: ControlPlane) -> None:
    """Upstream's v26.7.0 rules, enforced at admission: a singleton named gpu-cluster, draDriver
    required, the image pattern, the healthcheck port range; defaults filled in."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "crds",
            "apply",
            f"--kubeconfig={control_plane.admin_kubeconfig}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )

    def gc(name: str, spec: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "GPUCluster",
            "metadata": {"name": name},
        }
        if spec is not None:
            body["spec"] = spec
        return body

    def causes(status: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (c.get("field", ""), c.get("message", "")) for c in status.get("details", {}).get("causes", [])
        ]

    code, status = _create(control_plane, gc("other", {"draDriver": {}}))
    assert code == 422 and any("singleton" in message for _, message in causes(status)), status
    code, status = _create(control_plane, gc("gpu-cluster", {}))
    assert code == 422 and ("spec.draDriver", "Required value") in causes(status), status
    code, status = _create(control_plane, gc("gpu-cluster", {"draDriver": {"image": "dra/driver"}}))
    assert code == 422 and [f for f, _ in causes(status)] == ["spec.draDriver.image"], status
    code, status = _create(
        control_plane,
        gc("gpu-cluster", {"draDriver": {"gpus": {"kubeletPlugin": {"healthcheck": {"port": 70000}}}}}),
    )
    assert code == 422 and [f for f, _ in causes(status)] == [
        "spec.draDriver.gpus.kubeletPlugin.healthcheck.port"
    ], status

    code, stored = _create(
        control_plane, gc("gpu-cluster", {"draDriver": {"computeDomains": {}}, "hostPaths": {}})
    )
    try:
        assert code == 201, stored
        assert stored["spec"]["draDriver"]["computeDomains"]["enabled"] is True
        assert stored["spec"]["hostPaths"]["kubeletRootDir"] == "/var/lib/kubelet"
    finally:
        control_plane.request("DELETE", "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster")


def test_computedomain_crds_admit_a_domain_and_keep_its_spec(control_plane: ControlPlane) -> None:
    """The IMEX kinds NVIDIA's DRA driver expects (shipped with our CRDs): a ComputeDomain with its
    defaults, an immutable spec, a clique with its daemons."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_operator.cli",
            "crds",
            "apply",
            f"--kubeconfig={control_plane.admin_kubeconfig}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    base = "/apis/resource.nvidia.com/v1beta1/namespaces/default"
    body: dict[str, Any] = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "imex"},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "imex-channel"}}},
    }
    created = control_plane.request("POST", f"{base}/computedomains", body)
    try:
        assert created["spec"] == {
            "numNodes": 0,
            "channel": {"allocationMode": "Single", "resourceClaimTemplate": {"name": "imex-channel"}},
        }
        changed = {**created, "spec": {**created["spec"], "numNodes": 4}}
        with pytest.raises(urllib.error.HTTPError) as refused:
            control_plane.request("PUT", f"{base}/computedomains/imex", changed)
        assert refused.value.code == 422
        assert "A computeDomain.spec is immutable" in json.loads(refused.value.read())["message"]
        bad = {**body, "metadata": {"name": "bad"}, "spec": {"numNodes": -1, "channel": {}}}
        with pytest.raises(urllib.error.HTTPError) as invalid:
            control_plane.request("POST", f"{base}/computedomains", bad)
        assert invalid.value.code == 422
        clique_name = f"{created['metadata']['uid']}.clique-1"
        clique = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainClique",
            "metadata": {"name": clique_name},
            "daemons": [{"nodeName": "n1", "ipAddress": "10.0.0.1", "cliqueID": "clique-1", "index": 0}],
        }
        made = control_plane.request("POST", f"{base}/computedomaincliques", clique)
        assert made["daemons"][0]["status"] == "NotReady"
        control_plane.request("DELETE", f"{base}/computedomaincliques/{clique_name}")
    finally:
        control_plane.request("DELETE", f"{base}/computedomains/imex")


def test_a_crd_another_release_owns_is_left_and_reported(control_plane: ControlPlane, kube: Client) -> None:
    """NVIDIA's DRA driver chart owns the ComputeDomain CRD (Helm's ownership marks name its
    release): the hook applies the others, leaves that one exactly as it is and says so; the status
    view reports it, compatible (it serves v1beta1 with status)."""
    name = "computedomains.resource.nvidia.com"
    marks = {
        "metadata": {
            "labels": {HELM_MANAGED_BY_LABEL: "Helm"},
            "annotations": {
                HELM_RELEASE_NAME: "nvidia-dra-driver-gpu",
                HELM_RELEASE_NAMESPACE: "nvidia-dra-driver-gpu",
            },
        }
    }
    theirs = kube.patch(CustomResourceDefinition, name, marks, patch_type=PatchType.MERGE)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_operator.cli",
                "crds",
                "apply",
                "--release",
                "gpu-operator/gpu-operator",
                f"--kubeconfig={control_plane.admin_kubeconfig}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        after = kube.get(CustomResourceDefinition, name)
        assert after.metadata.resourceVersion == theirs.metadata.resourceVersion  # not written at all
        assert (after.metadata.labels or {})[HELM_MANAGED_BY_LABEL] == "Helm"
        owner = LeftCRD(name, Release("nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu"))
        assert owner.sentence() in done.stdout.splitlines()
        assert "applied computedomaincliques.resource.nvidia.com (Established)" in done.stdout.splitlines()
        assert collect(kube).crds == [owner]
    finally:
        kube.patch(
            CustomResourceDefinition,
            name,
            {
                "metadata": {
                    "labels": {HELM_MANAGED_BY_LABEL: "gpu-operator"},
                    "annotations": {HELM_RELEASE_NAME: None, HELM_RELEASE_NAMESPACE: None},
                }
            },
            patch_type=PatchType.MERGE,
        )
    assert collect(kube).crds == []
