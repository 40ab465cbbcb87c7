"""The platform a cluster runs. OpenShift is where the ClusterVersion `version`
(config.openshift.io/v1) exists: the signal NVIDIA's operator reads (v26.7.0
controllers/clusterinfo/clusterinfo.go, getOpenshiftVersion: a 404 means not OpenShift). Its version
is the major.minor of the first Completed entry of the ClusterVersion's status.history (OpenShift
writes the newest first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from httpx2 import HTTPStatusError
from lightkube import Client

from gpu_operator.kube.client import Kube
from gpu_operator.kube.resources import ClusterVersionResource, collection_path

GROUP, VERSION, PLURAL, NAME = "config.openshift.io", "v1", "clusterversions", "version"


class PlatformError(RuntimeError):
    """The cluster is OpenShift but its version cannot be told."""


def openshift_version(cluster_version: Mapping[str, Any] | None) -> str:
    """ "" without a ClusterVersion (not OpenShift), else its version as major.minor ("4.17")."""
    if cluster_version is None:
        return ""
    for entry in (cluster_version.get("status") or {}).get("history") or []:
        if entry.get("state") != "Completed":
            continue
        parts = str(entry.get("version", "")).split(".")
        return ".".join(parts[:2])
    raise PlatformError(
        f"ClusterVersion {NAME} ({GROUP}/{VERSION}) lists no Completed update in "
        "status.history: the OpenShift version is unknown until the cluster's first update "
        "completes (`oc get clusterversion version`)"
    )


def platform_name(version: str) -> str:
    return f"OpenShift {version}" if version else "Kubernetes"


async def read_openshift_version(kube: Kube) -> str:
    """The operator's start-up read (controllers/discovery.py ClusterInfo): "" where not OpenShift
    (404: no such object, or the group is not served, which the apiserver answers in plain text).
    Raises PlatformError for any other answer (a 403: the chart grants get on clusterversions)."""
    answer = await kube.get_answer(collection_path(GROUP, VERSION, PLURAL, name=NAME))
    if answer.status == 404:
        return ""
    if answer.status != 200:
        said = f"{answer.status} {answer.reason}" if answer.status else answer.error
        raise PlatformError(f"GET {answer.path} (is this OpenShift?) answered {said}")
    return openshift_version(answer.json())


def read_openshift_version_sync(client: Client) -> str | None:
    """The same read for `gpu-operator status`; None for a user who may not read the ClusterVersion."""
    try:
        got: Any = client.get(ClusterVersionResource, NAME)
        found: dict[str, Any] | None = dict(got.to_dict())
    except HTTPStatusError as err:  # lightkube's ApiError is one; a group not served answers plain text
        if err.response.status_code == 403:
            return None
        if err.response.status_code != 404:
            raise
        found = None
    return openshift_version(found)
