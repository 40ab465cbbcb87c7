"""Pointing an install at a mirror registry: the mapping rule for image references, the chart values
that apply it to every image key, and the commands that copy the images there. Pure.

The rule: the source registry's host is replaced by the mirror, the repository path and the tag or
digest are kept: `nvcr.io/nvidia/k8s-device-plugin:v0.20.0` -> `MIRROR/nvidia/k8s-device-plugin:v0.20.0`,
`ghcr.io/gpu-operator-py/gpu-operator:0.1.0` -> `MIRROR/gpu-operator-py/gpu-operator:0.1.0`, a Docker Hub
name `busybox:1` -> `MIRROR/library/busybox:1` (Docker's own normalisation). A reference already under
the mirror stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.render.defaults import CUDA_WORKLOAD_IMAGE
from gpu_operator.render.images import IMAGE_ENV

DOCKER_HUB = "docker.io"
# Image variables the renderer falls back on by itself when the operator's env lacks them (the chart
# sets the others from the values): the mirror values hand the operator the mirrored default.
RENDERER_FALLBACKS = {"CUDA_VALIDATOR_IMAGE": CUDA_WORKLOAD_IMAGE}
# NVIDIA's operator image, which the chart replaces by ours (templates/_helpers.tpl isUpstreamOperatorImage).
UPSTREAM_OPERATOR = ("nvcr.io/nvidia", "gpu-operator")
_MIRROR = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


class MirrorError(ValueError):
    """A mirror name that is not a registry (and path), or two images that would land on one name."""


@dataclass(frozen=True)
class Reference:
    """An image reference split as Docker splits it."""

    registry: str
    path: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, reference: str) -> Reference:
        name, _, digest = reference.partition("@")
        head, slash, rest = name.partition("/")
        if slash and ("." in head or ":" in head or head == "localhost"):
            registry, remainder = head, rest
        else:
            registry, remainder = DOCKER_HUB, name
        path, tag = remainder.rsplit(":", 1) if ":" in remainder.rsplit("/", 1)[-1] else (remainder, "")
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        return cls(registry, path, tag, digest)

    def suffix(self) -> str:
        return (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def full(self) -> str:
        return f"{self.registry}/{self.path}{self.suffix()}"


def check_mirror(mirror: str) -> str:
    """The mirror as given, without a trailing slash; MirrorError says what a valid one looks like."""
    value = mirror.strip().rstrip("/")
    host = value.split("/")[0]
    # a first part without a dot or port is a Docker Hub namespace to every runtime, not a registry
    if not _MIRROR.match(value) or ("." not in host and ":" not in host and host != "localhost"):
        raise MirrorError(
            f"--mirror {mirror!r}: give a registry host with an optional path, no scheme and no tag, "
            "e.g. --mirror registry.example.com:5000/gpu"
        )
    return value


def under(reference: str, mirror: str) -> bool:
    return reference.startswith(mirror + "/")


def mirrored(reference: str, mirror: str) -> str:
    """The reference's place in the mirror (the module's rule)."""
    if under(reference, mirror):
        return reference
    ref = Reference.parse(reference)
    return f"{mirror}/{ref.path}{ref.suffix()}"


def mirrored_repository(repository: str, mirror: str) -> str:
    """A values `repository` (registry and path, no image name) in the mirror: the same rule, so that
    repository/image:version of the result is `mirrored` of the original."""
    if repository == mirror or under(repository, mirror):
        return repository
    head, slash, rest = repository.partition("/")
    if "." in head or ":" in head or head == "localhost":
        return f"{mirror}/{rest}" if slash and rest else mirror
    return f"{mirror}/{repository}"


def check_targets(images: Iterable[str], mirror: str) -> dict[str, str]:
    """{source: target} for every image; MirrorError where two sources land on one target
    (the same path in two registries)."""
    targets: dict[str, str] = {}
    sources: dict[str, str] = {}
    for image in sorted(set(images)):
        target = mirrored(image, mirror)
        other = sources.setdefault(target, image)
        if other != image and Reference.parse(other).full() != Reference.parse(image).full():
            raise MirrorError(
                f"{other} and {image} would both be {target} in the mirror (same path in two "
                "registries): point one of them at another repository in your values"
            )
        targets[image] = target
    return targets


def copy_commands(images: Iterable[str], mirror: str) -> list[str]:
    """One `skopeo copy` per image not yet in the mirror: every architecture of a multi-arch index
    (`--all`) with its digest unchanged (`--preserve-digests`), so a digest pinned in the values
    names the same image in the mirror."""
    return [
        f"skopeo copy --all --preserve-digests docker://{Reference.parse(src).full()} docker://{dst}"
        for src, dst in sorted(check_targets(images, mirror).items())
        if src != dst
    ]


def mirror_values(
    values: Mapping[str, Any], mirror: str, operator_image: str, operator_env: Mapping[str, str]
) -> dict[str, Any]:
    """The values to layer last (`-f`) so that every image of the install comes from the mirror.

    `values` are the chart's defaults with the user's layers merged in (what the chart renders
    from); `operator_image` is the image the chart runs the operator with and `operator_env` its
    image variables (ClusterFacts.operator_env). Every mapping with a `repository` gets it
    mirrored (a full reference in `image` alone, mirrored); NVIDIA's operator image pair, which the
    chart swaps for ours, is written as ours in the mirror; every `env` list with an image variable
    is written whole (Helm replaces lists), its image values mirrored."""
    out: dict[str, Any] = {}
    _walk(values, (), mirror, Reference.parse(operator_image), out)
    missing = {name: default for name, default in RENDERER_FALLBACKS.items() if name not in operator_env}
    if missing:
        env = list(_get(out, ("operator", "env")) or (values.get("operator") or {}).get("env") or [])
        env += [
            {"name": name, "value": mirrored(default, mirror)} for name, default in sorted(missing.items())
        ]
        _put(out, ("operator", "env"), env)
    return out


def _walk(node: Any, path: tuple[str, ...], mirror: str, ours: Reference, out: dict[str, Any]) -> None:
    if not isinstance(node, Mapping):
        return
    repository, image = str(node.get("repository") or ""), str(node.get("image") or "")
    if "repository" in node and "image" in node:
        if (repository, image) == UPSTREAM_OPERATOR:
            own_repository, _, own_image = f"{ours.registry}/{ours.path}".rpartition("/")
            _put(out, (*path, "repository"), mirrored_repository(own_repository, mirror))
            _put(out, (*path, "image"), own_image)
            _put(out, (*path, "version"), ours.digest or ours.tag)
        elif repository:
            _put(out, (*path, "repository"), mirrored_repository(repository, mirror))
        elif "/" in image and not node.get(
            "version"
        ):  # a full reference alone (a bare name pulls nothing usable)
            _put(out, (*path, "image"), mirrored(image, mirror))
    for key, value in node.items():
        if key == "env" and isinstance(value, list) and any(_is_image_var(v) for v in value):
            _put(
                out,
                (*path, "env"),
                [{**v, "value": mirrored(str(v["value"]), mirror)} if _is_image_var(v) else v for v in value],
            )
        elif isinstance(value, Mapping):
            _walk(value, (*path, str(key)), mirror, ours, out)


def _is_image_var(var: Any) -> bool:
    return (
        isinstance(var, Mapping)
        and bool(IMAGE_ENV.search(str(var.get("name", ""))))
        and bool(var.get("value"))
    )


def _get(out: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = out
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _put(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
