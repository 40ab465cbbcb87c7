"""The real node pulls our image from the simulator's registry (TLS from the simulator's CA, basic
auth) with an imagePullSecret, as a node of a site with a private registry does; with a wrong
secret the kubelet reports the pull failure and the registry saw the refused credentials."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Secret

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.statusview.operatorpods import IMAGE_REASONS
from tests.integration.realnode_fixtures import REAL_NODE, api_log
from tests.integration.registry_fixtures import PushedImage
from tests.support.cleanup import delete_if_present
from tests.support.waiting import wait_for

NAMESPACE = "registry-pull"


def pull_secret(name: str, config: dict[str, Any]) -> Secret:
    """A `kubectl create secret docker-registry` Secret."""
    data = {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}
    return Secret(metadata=ObjectMeta(name=name), type="kubernetes.io/dockerconfigjson", data=data)


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    try:
        yield NAMESPACE
    finally:
        delete_if_present(kube, Namespace, NAMESPACE)


def _pod(plane: ControlPlane, name: str, image: str, secret: str) -> None:
    plane.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": REAL_NODE,
                "restartPolicy": "Never",
                "imagePullSecrets": [{"name": secret}],
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "command": ["python3.11", "-c", "print('pulled')"],
                    }
                ],
            },
        },
    )


def _get(plane: ControlPlane, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = plane.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    return pod


def _waiting_reason(pod: dict[str, Any]) -> str:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        return str(((cs.get("state") or {}).get("waiting") or {}).get("reason", ""))
    return ""


def _answered(image: PushedImage, seen: int, path: str, status: str) -> list[dict[str, str]]:
    """The registry's answers `status` to the secret's user for `path` (containerd resolves a tag
    with HEAD, then GETs by digest), among the requests after the first `seen`."""
    requests = image.registry.requests()[seen:]
    found = [
        r
        for r in requests
        if r["path"] == path and r["user"] == image.registry.user and r["status"] == status
    ]
    assert found, f"no {status} for {image.registry.user} on {path}: {requests}"
    return found


def test_the_real_node_pulls_our_image_with_the_pull_secret_and_not_with_a_wrong_one(
    control_plane: ControlPlane, kube: Client, registry_image: PushedImage, namespace: str
) -> None:
    registry, tag = registry_image.registry, registry_image.ref.rsplit(":", 1)[1]
    manifest = f"/v2/{registry_image.ref.split('/', 1)[1].rsplit(':', 1)[0]}/manifests/{tag}"
    kube.create(pull_secret("registry-creds", registry.docker_config()), namespace=NAMESPACE)
    kube.create(
        pull_secret("wrong-creds", registry.docker_config(password="not-the-password")), namespace=NAMESPACE
    )
    seen = len(registry.requests())
    t0 = time.monotonic()
    _pod(control_plane, "pulled", registry_image.ref, "registry-creds")
    _pod(control_plane, "refused", registry_image.ref, "wrong-creds")
    phase = wait_for(
        "the pod with the right secret finished",
        lambda: _get(control_plane, "pulled")["status"].get("phase"),
        until=lambda p: p in ("Succeeded", "Failed"),
        timeout=120,
        context=lambda: _get(control_plane, "pulled")["status"],
    )
    pulled = time.monotonic() - t0
    assert phase == "Succeeded", _get(control_plane, "pulled")["status"]
    assert api_log(control_plane, NAMESPACE, "pulled", "main") == ["pulled"]
    # The image came from the registry, fetched by the node as the secret's user.
    assert _answered(registry_image, seen, manifest, "200")
    assert registry_image.ref in registry_image.node.containerd.images()

    refused = wait_for(
        "the pod with the wrong secret failing to pull",
        lambda: _get(control_plane, "refused"),
        until=lambda p: _waiting_reason(p) in IMAGE_REASONS,
        timeout=90,
        context=lambda: _get(control_plane, "refused")["status"],
    )
    assert refused["status"]["phase"] == "Pending"
    assert _answered(registry_image, seen, manifest, "401")
    print(f"\npull through the registry: pod Succeeded {pulled:.1f}s after creation")
