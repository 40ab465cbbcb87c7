"""`gpu-operator status` says the platform the operator detects (OpenShift and its version) and
which of our CRDs another Helm release owns, an incompatible one among the problems."""

from __future__ import annotations

from typing import Any, cast

import httpx2
import pytest
from lightkube import Client
from rich.console import Console

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.kube.crdowners import LeftCRD
from gpu_operator.statusview.collect import left_crds, platform
from gpu_operator.statusview.render import render_view
from gpu_operator.statusview.table import build_view
from tests.unit.kube.test_crdowners import DRA, theirs
from tests.unit.statusview.test_table import node, policy


class Obj:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


def _refusal(code: int) -> httpx2.HTTPStatusError:
    request = httpx2.Request("GET", "https://apiserver/x")
    return httpx2.HTTPStatusError(str(code), request=request, response=httpx2.Response(code, request=request))


class FakeClient:
    """Answers GETs by name from `objects`; a name missing answers 404, `refuse` answers every GET."""

    def __init__(self, objects: dict[str, dict[str, Any]], refuse: int | None = None) -> None:
        self.objects, self.refuse = objects, refuse

    def get(self, _resource: Any, name: str) -> Obj:
        if self.refuse:
            raise _refusal(self.refuse)
        if name not in self.objects:
            raise _refusal(404)
        return Obj(self.objects[name])


def test_crds_another_release_owns() -> None:
    ours = next(c for c in load_packaged() if c["metadata"]["name"] == "clusterpolicies.nvidia.com")
    client = FakeClient(
        {
            "clusterpolicies.nvidia.com": ours,
            "computedomains.resource.nvidia.com": theirs("computedomains.resource.nvidia.com", status=False),
            "computedomaincliques.resource.nvidia.com": theirs("computedomaincliques.resource.nvidia.com"),
        }
    )
    found = left_crds(cast(Client, client))
    assert found == [
        LeftCRD("computedomaincliques.resource.nvidia.com", DRA),
        LeftCRD(
            "computedomains.resource.nvidia.com",
            DRA,
            ("the status subresource in resource.nvidia.com/v1beta1",),
        ),
    ]
    assert left_crds(cast(Client, FakeClient({}, refuse=403))) == []  # may not read CRDs: nothing said


@pytest.mark.parametrize(
    ("objects", "refuse", "said"),
    [
        (
            {"version": {"status": {"history": [{"state": "Completed", "version": "4.17.3"}]}}},
            None,
            "OpenShift 4.17",
        ),
        ({}, None, ""),  # no ClusterVersion: plain Kubernetes, nothing said
        ({}, 403, ""),  # may not read it: nothing said
        (
            {"version": {"status": {"history": []}}},
            None,
            "OpenShift (version unknown: no update has completed)",
        ),
    ],
)
def test_platform(objects: dict[str, dict[str, Any]], refuse: int | None, said: str) -> None:
    assert platform(cast(Client, FakeClient(objects, refuse))) == said


def test_the_view_shows_the_platform_and_a_compatible_crd_as_a_note() -> None:
    view = build_view(
        [node("gpu-a")],
        [],
        [],
        [policy(state="notReady", reason="OperandNotReady", message="m")],
        "gpu-operator",
    )
    view.platform = "OpenShift 4.17"
    left = LeftCRD("computedomains.resource.nvidia.com", DRA)
    view.crds = [left]
    console = Console(record=True, width=400)
    console.print(render_view(view))
    lines = console.export_text().splitlines()
    assert lines[0].endswith("operands in namespace gpu-operator   platform OpenShift 4.17")
    assert left.sentence() in lines
