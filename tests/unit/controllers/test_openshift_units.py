"""Start-up discovery's platform reaches every render: the three reconciling units each hand their
reconcile the read model's one `ReadSnapshot` of the pass, which carries it, and the GPUCluster's DRA
stack gets its SCCs on OpenShift (none elsewhere)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator.controllers.apply import ReconcileReport
from gpu_operator.controllers.customresources import CUSTOM_RESOURCES, GPU_CLUSTER
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.readmodel import ReadModel, ReadSnapshot
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.clusterpolicy.unit import ClusterPolicyUnit
from gpu_operator.controllers.units.gpucluster.reconcile import GPUClusterReconciler
from gpu_operator.controllers.units.gpucluster.unit import GPUClusterUnit
from gpu_operator.controllers.units.nvidiadriver.unit import NVIDIADriverUnit
from gpu_operator.controllers.views import GPUClusterView
from gpu_operator.controllers.watchedkinds import OWNED_KINDS
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from tests.unit.controllers.units.gpucluster.test_gpucluster_crds import CRDKube


@pytest.mark.parametrize("version", ["4.17", ""])
def test_the_units_reconcile_the_read_models_snapshot(version: str) -> None:
    model = ReadModel("gpu-operator", info=ClusterInfo("1.36.3", openshift_version=version))
    model.indices = {
        index: {}
        for index in (*(row.index_id for row in CUSTOM_RESOURCES), *(k.index_id for k in OWNED_KINDS))
    }
    kube: Any = None
    settings = OperatorSettings()
    images = dict(CHART_DEFAULT_IMAGES)
    units: list[Any] = [
        ClusterPolicyUnit(kube, settings, model, images, lambda: False),
        NVIDIADriverUnit(kube, settings, model, images),
        GPUClusterUnit(kube, settings, model, images),
    ]
    seen: list[ReadSnapshot] = []

    async def reconcile(snap: ReadSnapshot) -> Any:
        seen.append(snap)
        return ReconcileReport()

    for unit in units:
        unit.reconciler.reconcile = reconcile
        asyncio.run(unit.reconcile())
    assert seen == [model.snapshot()] * 3
    assert {snap.info.openshift_version for snap in seen} == {version}
    assert {snap.info.openshift for snap in seen} == {bool(version)}


@pytest.mark.parametrize("openshift", [True, False])
def test_the_dra_stack_gets_sccs_only_on_openshift(openshift: bool) -> None:
    kube = CRDKube({})
    body = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {
            "name": "gpu-cluster",
            "uid": "gc-uid",
            "finalizers": ["gpucluster.nvidia.com/dra-resourceclaim"],
        },
        "spec": {"draDriver": {}},
    }
    snap = ReadSnapshot(
        "gpu-operator",
        ClusterInfo(openshift_version="4.17" if openshift else ""),
        crs={GPU_CLUSTER: (GPUClusterView("gpu-cluster", "gc-uid", 1, "t", body),)},
    )
    asyncio.run(GPUClusterReconciler(kube, images=CHART_DEFAULT_IMAGES).reconcile(snap))  # type: ignore[arg-type]
    sccs = [o["metadata"]["name"] for o in kube.live.values() if o["kind"] == "SecurityContextConstraints"]
    assert bool(sccs) is openshift
