"""Image references: CR fields, then the operator's *_IMAGE env fallback; sha256 digests; pull policy."""

from __future__ import annotations

from gpu_operator.api.common import ImageFields
from gpu_operator.render.result import RenderError

PULL_POLICIES = ("Always", "Never", "IfNotPresent")


def image_path(fields: ImageFields | None, env_name: str, operator_env: dict[str, str] | object,
               field_path: str) -> str:
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
        return str(fallback)
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
