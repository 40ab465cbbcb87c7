"""Pure: the chart's own pods (the operator, the CRD hook Job, the uninstall cleanup Job) -> why
they are not running, with the values key to fix. When the operator cannot start nothing of
ours reports anything (no ClusterPolicy status, no Event), so `gpu-operator status` reads them."""

from __future__ import annotations

from typing import Any

COMPONENT_LABEL = "app.kubernetes.io/component"
RELEASE_LABEL = "app.kubernetes.io/instance"  # the chart's pods carry their Helm release's name
MAX_PULL_BACKOFF_S = 300  # the kubelet's MaxImageBackOff (pkg/kubelet/kubelet.go)
# What each pod is, by its component label (the chart's; NVIDIA's operator pod carries the same).
ROLES = {
    "gpu-operator": "the operator",
    "crds": "the CRD hook Job (helm install/upgrade waits for it)",
    "cleanup": "the uninstall cleanup Job (helm uninstall waits for it)",
}
IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
IMAGE_KEYS = (
    "operator.repository, operator.image and operator.version (operator.imagePullSecrets for a "
    "private registry)"
)


def _waiting(pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(container, reason, message) of every container waiting for a reason other than start-up."""
    status = pod.get("status") or {}
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                out.append((str(cs.get("name", "")), str(waiting["reason"]), str(waiting.get("message", ""))))
    return out


def _image_of(pod: dict[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if c.get("name") == container:
            return str(c.get("image", ""))
    return ""


def _registry(image: str) -> str:
    """The registry host of an image reference (Docker Hub when its first part is no host)."""
    first, sep, _ = image.partition("/")
    return first if sep and ("." in first or ":" in first or first == "localhost") else "docker.io"


def _pull_secrets(pod: dict[str, Any], image: str) -> str:
    """What to check when the pod pulls with Secrets: they come from operator.imagePullSecrets."""
    names = [str(s.get("name", "")) for s in (pod.get("spec") or {}).get("imagePullSecrets") or []]
    if not names:
        return ""
    return (
        f"; it pulls with the Secret {', '.join(names)} (operator.imagePullSecrets): check that it holds "
        f"valid credentials for {_registry(image)}"
    )


def _recovery(pod: dict[str, Any]) -> str:
    """The commands that get the release past a pod that cannot pull. A Secret fixed in place is
    used at the kubelet's next pull (its image back-off doubles from 10 s to at most 300 s), which
    finishes an install only while helm still waits on it; a helm that gave up left the release
    failed, and `helm upgrade --install` with the same release reruns the hooks (the CRD hook's
    before-hook-creation policy replaces the Job helm gave up on)."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(COMPONENT_LABEL) == "cleanup":
        return (
            "fix them and `helm uninstall` again, or `helm uninstall --no-hooks` and `gpu-operator cleanup` "
            "if the release cannot run its own hooks"
        )
    release = (meta.get("labels") or {}).get(RELEASE_LABEL) or "RELEASE"
    return (
        f"a Secret fixed in place (same name) is used at the kubelet's next pull, within {MAX_PULL_BACKOFF_S} s, "
        f"while helm still waits; once helm has failed, run `helm upgrade --install {release} CHART "
        f"--namespace {meta.get('namespace', '')}` with the fixed values, or `helm uninstall --no-hooks` and "
        "`gpu-operator cleanup` to give the release up"
    )


def operator_problems(pods: list[dict[str, Any]]) -> list[str]:
    """One line per pod of the chart's that waits on something it cannot get by itself."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        role = ROLES.get((meta.get("labels") or {}).get(COMPONENT_LABEL, ""))
        if role is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for container, reason, message in _waiting(pod):
            if reason in IMAGE_REASONS:
                image = _image_of(pod, container)
                out.append(
                    f"{role}: pod {where} cannot pull image {image!r} ({reason}){_pull_secrets(pod, image)}; "
                    f"the chart builds it from {IMAGE_KEYS}: {_recovery(pod)}"
                )
            else:
                said = f": {message[:300]}" if message else ""
                out.append(f"{role}: pod {where}, container {container}: {reason}{said}")
    return out
