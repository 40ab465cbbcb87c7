"""The DRA stack with ComputeDomain CRDs another Helm release owns (NVIDIA's DRA driver chart): the
stack works with that copy when it serves what the DRA driver needs, and the GPUCluster's status
names what it lacks when it does not (the rest of the stack is applied all the same)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator import vocabulary as vocab
from gpu_operator.controllers.customresources import GPU_CLUSTER
from gpu_operator.controllers.readmodel import ReadSnapshot
from gpu_operator.controllers.units.gpucluster.reconcile import COMPUTE_DOMAIN_CRDS, GPUClusterReconciler
from gpu_operator.controllers.views import GPUClusterView
from gpu_operator.controllers.watchedkinds import OWNED_KINDS
from gpu_operator.kube.crdowners import LeftCRD
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from tests.unit.controllers.test_apply_contract import RecordingKube
from tests.unit.kube.test_crdowners import DRA, theirs

WATCHED = frozenset(k.kind for k in OWNED_KINDS)


class CRDKube(RecordingKube):
    """Holds `crds` by name and counts their reads; everything else as RecordingKube."""

    def __init__(self, crds: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.crds = crds
        self.crd_reads = 0

    async def get_dict(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
    ) -> dict[str, Any] | None:
        if kind != "CustomResourceDefinition":
            return None
        self.crd_reads += 1
        return self.crds.get(name)

    async def served_versions(self, group: str, kind: str) -> list[str]:
        return ["v1"]

    async def merge_patch(self, *_: Any, **__: Any) -> None:
        pass


def one_pass(reconciler: GPUClusterReconciler, kube: CRDKube, spec: dict[str, Any]) -> Any:
    body = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {
            "name": "gpu-cluster",
            "uid": "gc-uid",
            "finalizers": ["gpucluster.nvidia.com/dra-resourceclaim"],
        },
        "spec": spec,
    }
    view = GPUClusterView("gpu-cluster", "gc-uid", 1, "t", body)
    return asyncio.run(
        reconciler.reconcile(
            ReadSnapshot("gpu-operator", crs={GPU_CLUSTER: (view,)}, owned=kube.owned(WATCHED))
        )
    )


@pytest.mark.parametrize("owned", [False, True])
def test_a_compatible_crd_of_another_release_is_used_as_it_is(owned: bool) -> None:
    kube = CRDKube({name: theirs(name) if owned else {} for name in COMPUTE_DOMAIN_CRDS})
    report = one_pass(GPUClusterReconciler(kube, images=CHART_DEFAULT_IMAGES), kube, {"draDriver": {}})  # type: ignore[arg-type]
    assert report.outcome.reason == vocab.OPERAND_NOT_READY  # just applied: waiting for pods, nothing else
    assert kube.crd_reads == len(COMPUTE_DOMAIN_CRDS)


def test_an_incompatible_crd_is_named_in_status_until_it_is_fixed() -> None:
    kube = CRDKube(
        {
            "computedomains.resource.nvidia.com": theirs("computedomains.resource.nvidia.com", status=False),
            "computedomaincliques.resource.nvidia.com": theirs("computedomaincliques.resource.nvidia.com"),
        }
    )
    reconciler = GPUClusterReconciler(kube, images=CHART_DEFAULT_IMAGES)  # type: ignore[arg-type]
    report = one_pass(reconciler, kube, {"draDriver": {}})
    lacking = LeftCRD(
        "computedomains.resource.nvidia.com", DRA, ("the status subresource in resource.nvidia.com/v1beta1",)
    )
    assert (report.outcome.state, report.outcome.reason) == (vocab.NOT_READY, vocab.PREREQUISITE_NOT_MET)
    assert report.outcome.message == lacking.sentence()
    assert "DaemonSet gpu-operator/nvidia-dra-driver-kubelet-plugin" in report.applied  # the rest still runs
    # the owner's chart is upgraded: the next pass reads the CRDs again and the condition goes
    kube.crds["computedomains.resource.nvidia.com"] = theirs("computedomains.resource.nvidia.com")
    assert one_pass(reconciler, kube, {"draDriver": {}}).outcome.reason == vocab.OPERAND_NOT_READY


def test_compute_domains_off_reads_no_crd() -> None:
    kube = CRDKube({name: theirs(name, status=False) for name in COMPUTE_DOMAIN_CRDS})
    report = one_pass(
        GPUClusterReconciler(kube, images=CHART_DEFAULT_IMAGES),  # type: ignore[arg-type]
        kube,
        {"draDriver": {"computeDomains": {"enabled": False}}},
    )
    assert report.outcome.reason == vocab.OPERAND_NOT_READY
    assert kube.crd_reads == 0
