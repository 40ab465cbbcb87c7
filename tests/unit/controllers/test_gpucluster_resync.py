"""Objects of kinds the operator does not watch (DeviceClasses, the admission policy, claim
templates) are read back on the GPUCluster's resync: one deleted by someone is applied again."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.controllers.apply import Applied, Applier, owner_reference
from gpu_operator.controllers.views import GPUClusterView
from gpu_operator.controllers.watchedkinds import OWNED_KINDS
from gpu_operator.kube.client import ObjectKey
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.dra import DRAFacts, render_gpucluster
from tests.unit.controllers.test_apply_contract import RecordingKube


class ReadingKube(RecordingKube):
    async def get_dict(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
    ) -> dict[str, Any] | None:
        wanted = ObjectKey(api_version, kind, name, namespace)
        return next((o for o in self.live.values() if ObjectKey.of(o) == wanted), None)


def test_a_deleted_deviceclass_is_applied_again_after_the_read_back() -> None:
    body = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster", "uid": "gc-uid"},
        "spec": {"draDriver": {}},
    }
    view = GPUClusterView("gpu-cluster", "gc-uid", 1, "t", body)
    result = render_gpucluster(
        GPUCluster.model_validate(body), DRAFacts(operator_env=dict(CHART_DEFAULT_IMAGES))
    )
    kube = ReadingKube()
    applier = Applier(kube)  # type: ignore[arg-type]
    watched = frozenset(k.kind for k in OWNED_KINDS)
    owner = owner_reference(view, "nvidia.com/v1alpha1", "GPUCluster")

    def apply() -> list[str]:
        done = Applied()
        asyncio.run(applier.apply(result, view, owner, kube.owned(watched), watched, done))
        return done.applied

    assert "DeviceClass gpu.nvidia.com" in apply()
    assert apply() == []  # nothing changed: nothing written, the unwatched kinds included
    assert asyncio.run(applier.verify_remembered("gc-uid")) == []  # read back, all there: still nothing
    assert apply() == []
    gone = next(
        k
        for k, o in kube.live.items()
        if o["kind"] == "DeviceClass" and o["metadata"]["name"] == "gpu.nvidia.com"
    )
    del kube.live[gone]
    assert asyncio.run(applier.verify_remembered("gc-uid")) == ["DeviceClass gpu.nvidia.com"]
    assert apply() == ["DeviceClass gpu.nvidia.com"]
