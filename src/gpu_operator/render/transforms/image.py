"""Image references: CR fields, then the operator's *_IMAGE env fallback; sha256 digests; pull policy."""

from __future__ import annotations

from gpu_operator.api.common import ImageFields
from gpu_operator.render.result import RenderError

PULL_POLICIES = ("Always", "Never", "IfNotPresent")


def image_path(
    fields: ImageFields | None,
    env_name: str,
    operator_env: dict[str, str] | object,
    field_path: str,
    *,
    partial: bool = False,
) -> str:
    """`repo/image:version` (or `@version` for digests), `image` alone, or the env fallback."""
    repository = (fields.repository or "") if fields else ""
    image = (fields.image or "") if fields else ""
    version = (fields.version or "") if fields else ""
    if image and not repository and not version:
        return image
    if repository and image and version:
        separator = "@" if version.startswith("sha256:") else ":"
        return f"{repository}/{image}{separator}{version}"
    fallback = operator_env.get(env_name, "") if isinstance(operator_env, dict) else ""
    if fallback:
        # With `partial`, a version (or a repository/image) given alone still counts: it replaces that
        # part of the default image, instead of being dropped as upstream drops it.
        return _override(str(fallback), repository, image, version) if partial else str(fallback)
    raise RenderError(
        field_path,
        f"no image: set {field_path}.repository, .image and .version (or .image alone as a full "
        f"reference), or give the operator the env var {env_name}",
    )


def pull_policy(value: str | None) -> str:
    """Upstream's rule: Always, Never or IfNotPresent; anything else means IfNotPresent."""
    return value if value in PULL_POLICIES else "IfNotPresent"


def with_os_tag(image: str, os_tag: str) -> str:
    """Driver images are published per OS: `<image>-<osTag>`, except for digests."""
    if "sha256:" in image or not os_tag:
        return image
    return f"{image}-{os_tag}"


def _override(reference: str, repository: str, image: str, version: str) -> str:
    """`reference` with the parts the policy did give replaced (repository, image name, tag or digest)."""
    if not (repository or image or version):
        return reference
    name, _, digest = reference.partition("@")
    base_repo, _, last = name.rpartition("/")
    last_name, colon, tag = last.partition(":")
    repository = repository or base_repo
    image = image or last_name
    if version:
        separator = "@" if version.startswith("sha256:") else ":"
        return f"{repository}/{image}{separator}{version}"
    return f"{repository}/{image}" + (f"@{digest}" if digest else f":{tag}" if colon else "")
