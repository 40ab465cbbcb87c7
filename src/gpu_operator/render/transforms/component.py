"""The common operand transform: pull policy/secrets, resources, args, env upsert and hostNetwork."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.common import (
    ComponentFields,
    DriverManagerSpec,
    EnvVar,
    ImageFields,
    ResourceRequirements,
)
from gpu_operator.render.objects import pod_containers, upsert_env
from gpu_operator.render.transforms.image import pull_policy


def pull_secrets(pod: dict[str, Any], secrets: list[str] | None) -> None:
    """Append image pull secrets to the pod (no duplicates)."""
    if not secrets:
        return
    current = pod.setdefault("imagePullSecrets", [])
    for secret in secrets:
        if secret and {"name": secret} not in current:
            current.append({"name": secret})


def env_upsert(ctr: dict[str, Any], env: list[EnvVar] | None) -> None:
    for entry in env or []:
        upsert_env(ctr, entry.name, entry.value)


def resources(fields: ComponentFields) -> dict[str, Any] | None:
    return requirements(fields.resources)


def requirements(spec: ResourceRequirements | None) -> dict[str, Any] | None:
    """A container's `resources` from the API model's requests and limits (None when empty)."""
    if spec is None:
        return None
    out: dict[str, Any] = {}
    if spec.limits:
        out["limits"] = {k: str(v) for k, v in spec.limits.items()}
    if spec.requests:
        out["requests"] = {k: str(v) for k, v in spec.requests.items()}
    return out or None


def host_network(pod: dict[str, Any], enabled: bool | None) -> None:
    """hostNetwork also needs dnsPolicy ClusterFirstWithHostNet to keep cluster DNS."""
    if enabled:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"


def apply_image(
    ctr: dict[str, Any],
    pod: dict[str, Any],
    image: str,
    fields: ImageFields | DriverManagerSpec | None,
) -> None:
    """Image, pull policy and pull secrets of one container."""
    ctr["image"] = image
    ctr["imagePullPolicy"] = pull_policy(fields.imagePullPolicy if fields else None)
    if fields:
        pull_secrets(pod, fields.imagePullSecrets)


def apply_component(pod: dict[str, Any], main: dict[str, Any], fields: ComponentFields) -> None:
    """Upstream's per-operand block: resources on every container, args and env on the main one."""
    limits = resources(fields)
    if limits:
        for ctr in pod_containers(pod):
            ctr["resources"] = limits
    if fields.args:
        main["args"] = list(fields.args)
    env_upsert(main, fields.env)
    host_network(pod, fields.hostNetwork)
