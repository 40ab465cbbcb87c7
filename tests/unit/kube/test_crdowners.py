"""Whose CRD it is (Helm's ownership marks) and whether another owner's copy serves what we need."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.kube.crdowners import LeftCRD, Release, helm_owner, left_crd, missing

DRA = Release("nvidia-dra-driver-gpu", "nvidia-dra-driver-gpu")
OURS = Release("gpu-operator", "gpu-operator")


def packaged(name: str) -> dict[str, Any]:
    return next(c for c in load_packaged() if c["metadata"]["name"] == name)


def marked(crd: dict[str, Any], release: Release | None, managed_by: str = "Helm") -> dict[str, Any]:
    live = copy.deepcopy(crd)
    meta = live["metadata"]
    meta["labels"] = {"app.kubernetes.io/managed-by": managed_by}
    if release is not None:
        meta["annotations"] = {
            "meta.helm.sh/release-name": release.name,
            "meta.helm.sh/release-namespace": release.namespace,
        }
    return live


COMPUTE_DOMAINS = "computedomains.resource.nvidia.com"


def theirs(name: str, *, status: bool = True) -> dict[str, Any]:
    """Our CRD `name` as NVIDIA's DRA driver release would own it; `status=False`: a copy without
    the status subresource."""
    crd = marked(packaged(name), DRA)
    if not status:
        for version in crd["spec"]["versions"]:
            version.pop("subresources", None)
    return crd


@pytest.mark.parametrize(
    ("live", "ours", "left_to"),
    [
        (None, OURS, None),  # absent: ours to create
        ("unmarked", OURS, None),  # ours from crds/ or an earlier hook run
        ("dra", OURS, DRA),  # another release's
        ("dra", None, DRA),  # run by hand: every Helm-marked CRD is another release's
        ("ours", OURS, None),  # our own release's (a chart that templates them)
        ("no-annotation", OURS, None),  # Helm's label alone names no release
        ("other-manager", OURS, None),  # the annotations without managed-by=Helm are not Helm's
    ],
)
def test_left_to_another_release(live: str | None, ours: Release | None, left_to: Release | None) -> None:
    crd = packaged(COMPUTE_DOMAINS)
    objects = {
        None: None,
        "unmarked": crd,
        "dra": marked(crd, DRA),
        "ours": marked(crd, OURS),
        "no-annotation": marked(crd, None),
        "other-manager": marked(crd, DRA, managed_by="argocd"),
    }
    decision = left_crd(objects[live], crd, ours)
    assert (decision.owner if decision else None) == left_to


def test_compatible_when_it_serves_our_versions_and_status() -> None:
    crd = packaged(COMPUTE_DOMAINS)
    theirs = marked(crd, DRA)
    # a newer chart that also serves another version, with its own schema: still compatible
    theirs["spec"]["versions"].append({"name": "v1", "served": True, "storage": False, "schema": {}})
    theirs["spec"]["versions"][0]["schema"] = {"openAPIV3Schema": {"type": "object"}}
    decision = left_crd(theirs, crd, OURS)
    assert decision == LeftCRD(COMPUTE_DOMAINS, DRA, ())
    assert decision.compatible


def test_incompatible_names_what_is_missing() -> None:
    crd = packaged(COMPUTE_DOMAINS)
    theirs = marked(crd, DRA)
    theirs["spec"]["versions"] = [
        {"name": "v1beta1", "served": False, "storage": True},
        {"name": "v1alpha1", "served": True, "storage": False},
    ]
    assert missing(theirs, crd) == ["version resource.nvidia.com/v1beta1 served"]
    theirs["spec"]["versions"] = [{"name": "v1beta1", "served": True, "storage": True}]
    assert missing(theirs, crd) == ["the status subresource in resource.nvidia.com/v1beta1"]
    decision = left_crd(theirs, crd, OURS)
    assert decision is not None and not decision.compatible
    assert decision.missing == ("the status subresource in resource.nvidia.com/v1beta1",)


def test_helm_owner_reads_the_marks() -> None:
    crd = packaged(COMPUTE_DOMAINS)
    assert helm_owner(marked(crd, DRA)) == DRA
    assert helm_owner(crd) is None


@pytest.mark.parametrize("text", ["gpu-operator", "/name", "ns/", "a/b/c"])
def test_release_option_names_its_form(text: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        Release.parse(text)
    assert Release.parse("gpu-operator/gpu-operator") == OURS
