"""Who owns a CRD this package ships, and whether another owner's copy serves what our code needs.

A CRD that another Helm release owns (Helm's ownership marks: the label
`app.kubernetes.io/managed-by=Helm` and the annotations `meta.helm.sh/release-name` and
`meta.helm.sh/release-namespace`) is that release's. NVIDIA's DRA driver chart owns the
ComputeDomain CRDs we ship too; two releases applying one CRD undo each other's writes (Argo CD
shows both apps out of sync forever). So `gpu-operator crds apply` (the chart's CRD hook) leaves
such a CRD as it is, and the operator works with the owner's copy when it is compatible: it serves
every version our copy serves, with the status subresource where ours has one. Our chart never
marks these CRDs as Helm's (they come from crds/ and the hook's server-side apply), so a CRD with
Helm's marks is another release's unless it names the release the hook was told is its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.crdgen import load_packaged
from gpu_operator.kube.client import Kube

HELM_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
HELM_MANAGED_BY = "Helm"
HELM_RELEASE_NAME = "meta.helm.sh/release-name"
HELM_RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"


@dataclass(frozen=True)
class Release:
    """A Helm release, as its ownership annotations name it."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> Release:
        """`NAMESPACE/NAME` (what the chart's hook passes as --release)."""
        namespace, _, name = text.partition("/")
        if not namespace or not name or "/" in name:
            raise ValueError(
                f"--release {text!r}: give the release as NAMESPACE/NAME (the chart passes "
                "{{ .Release.Namespace }}/{{ .Release.Name }})"
            )
        return cls(namespace, name)


def helm_owner(crd: Mapping[str, Any]) -> Release | None:
    """The Helm release whose ownership marks the object carries; None without them."""
    meta = crd.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    name = annotations.get(HELM_RELEASE_NAME)
    if labels.get(HELM_MANAGED_BY_LABEL) != HELM_MANAGED_BY or not name:
        return None
    return Release(str(annotations.get(HELM_RELEASE_NAMESPACE) or ""), str(name))


def other_owner(crd: Mapping[str, Any], ours: Release | None) -> Release | None:
    """The release owning the CRD when it is not `ours` (None: ours to apply)."""
    owner = helm_owner(crd)
    return None if owner is None or owner == ours else owner


def missing(live: Mapping[str, Any], packaged: Mapping[str, Any]) -> list[str]:
    """What our copy of a CRD serves that the live one does not: each served version, and the status
    subresource of each version that has one in ours (the DRA driver writes ComputeDomain status)."""
    group = packaged["spec"]["group"]
    theirs = {v.get("name"): v for v in (live.get("spec") or {}).get("versions") or []}
    out = []
    for version in packaged["spec"]["versions"]:
        if not version.get("served"):
            continue
        name = version["name"]
        found = theirs.get(name)
        if found is None or not found.get("served"):
            out.append(f"version {group}/{name} served")
        elif "status" in (version.get("subresources") or {}) and "status" not in (
            found.get("subresources") or {}
        ):
            out.append(f"the status subresource in {group}/{name}")
    return out


@dataclass(frozen=True)
class LeftCRD:
    """A CRD we ship that another Helm release owns: left as it is, usable when nothing is missing."""

    name: str
    owner: Release
    missing: tuple[str, ...] = ()

    @property
    def compatible(self) -> bool:
        return not self.missing

    def sentence(self) -> str:
        said = (
            f"CRD {self.name} belongs to Helm release {self.owner}: left as it is (not taken over by "
            "this chart's CRD hook)"
        )
        if self.compatible:
            return f"{said}; compatible: it serves what this operator needs"
        return (
            f"{said}; not compatible: it lacks {', '.join(self.missing)}; upgrade release {self.owner} to a "
            "version whose CRD has them, or remove its ownership marks (the label "
            f"{HELM_MANAGED_BY_LABEL}=Helm and the {HELM_RELEASE_NAME}/{HELM_RELEASE_NAMESPACE} "
            "annotations) to let this chart's CRD hook manage it"
        )


def left_crd(
    live: Mapping[str, Any] | None, packaged: Mapping[str, Any], ours: Release | None
) -> LeftCRD | None:
    """The decision for one CRD we ship: None when it is ours to apply (absent, unmarked, or our
    release's), else who owns it and what it lacks."""
    if live is None:
        return None
    owner = other_owner(live, ours)
    if owner is None:
        return None
    return LeftCRD(str(packaged["metadata"]["name"]), owner, tuple(missing(live, packaged)))


async def owned_elsewhere(kube: Kube, names: Iterable[str], ours: Release | None = None) -> list[LeftCRD]:
    """The CRDs among `names` (ones we ship) that a Helm release other than `ours` owns, as the
    apiserver has them now, each with what it lacks."""
    packaged = {crd["metadata"]["name"]: crd for crd in load_packaged()}
    out = []
    for name in names:
        live = await kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        decision = left_crd(live, packaged[name], ours)
        if decision is not None:
            out.append(decision)
    return out
