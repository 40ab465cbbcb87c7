"""Small builders for Kubernetes manifests as plain dicts (containers, volumes, env, metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_operator.api.clusterpolicy import ClusterPolicy, ClusterPolicySpec
from gpu_operator.render.facts import ClusterFacts
from gpu_operator.render.result import Manifest
from gpu_operator.vocabulary import MANAGED_BY, MANAGED_BY_VALUE, STATE_LABEL


@dataclass(frozen=True)
class Ctx:
    """What every builder and transform receives: the policy and the cluster facts."""

    policy: ClusterPolicy
    facts: ClusterFacts

    @property
    def spec(self) -> ClusterPolicySpec:
        return self.policy.spec

    @property
    def ns(self) -> str:
        return self.facts.namespace


def ownership(state: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGED_BY_VALUE, STATE_LABEL: state}


def obj(api_version: str, kind: str, name: str, state: str, namespace: str | None, **body: Any) -> Manifest:
    metadata: dict[str, Any] = {"name": name, "labels": ownership(state)}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **body}


def hostpath(name: str, path: str, type_: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": path}
    if type_:
        source["type"] = type_
    return {"name": name, "hostPath": source}


def configmap_volume(
    name: str,
    configmap: str,
    mode: int | None = None,
    items: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    source: dict[str, Any] = {"name": configmap}
    if mode is not None:
        source["defaultMode"] = mode
    if items:
        source["items"] = items
    return {"name": name, "configMap": source}


def mount(
    name: str,
    path: str,
    *,
    readonly: bool = False,
    propagation: str | None = None,
    sub_path: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "mountPath": path}
    if readonly:
        out["readOnly"] = True
    if propagation:
        out["mountPropagation"] = propagation
    if sub_path:
        out["subPath"] = sub_path
    return out


def env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def env_field(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


NODE_NAME = env_field("NODE_NAME", "spec.nodeName")
OPERATOR_NAMESPACE = env_field("OPERATOR_NAMESPACE", "metadata.namespace")
NAMESPACE = env_field("NAMESPACE", "metadata.namespace")
POD_NAME = env_field("POD_NAME", "metadata.name")


def container(
    name: str,
    *,
    command: list[str] | None = None,
    args: list[str] | None = None,
    env_vars: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    privileged: bool = False,
    image: str = "",
    **extra: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": "IfNotPresent"}
    if command:
        out["command"] = command
    if args:
        out["args"] = args
    if env_vars:
        out["env"] = env_vars
    if mounts:
        out["volumeMounts"] = mounts
    if privileged:
        out["securityContext"] = {"privileged": True}
    out.update(extra)
    return out


def pod_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """Init containers then containers (every container of a pod spec)."""
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def find(pod: dict[str, Any], name: str) -> dict[str, Any] | None:
    for ctr in pod_containers(pod):
        if ctr["name"] == name:
            return ctr
    return None


def upsert_env(ctr: dict[str, Any], name: str, value: str) -> None:
    """Set env `name` on a container, replacing an existing entry in place."""
    entries = ctr.setdefault("env", [])
    for entry in entries:
        if entry["name"] == name:
            entry.pop("valueFrom", None)
            entry["value"] = value
            return
    entries.append(env(name, value))


def get_env(ctr: dict[str, Any], name: str) -> str | None:
    for entry in ctr.get("env", []):
        if entry["name"] == name and "value" in entry:
            return str(entry["value"])
    return None


def add_volume(pod: dict[str, Any], volume: dict[str, Any]) -> None:
    """Add (or replace, by name) a pod volume."""
    volumes = pod.setdefault("volumes", [])
    for index, existing in enumerate(volumes):
        if existing["name"] == volume["name"]:
            volumes[index] = volume
            return
    volumes.append(volume)


def add_mount(ctr: dict[str, Any], volume_mount: dict[str, Any]) -> None:
    mounts = ctr.setdefault("volumeMounts", [])
    for index, existing in enumerate(mounts):
        if existing["mountPath"] == volume_mount["mountPath"]:
            mounts[index] = volume_mount
            return
    mounts.append(volume_mount)


def remove_containers(pod: dict[str, Any], *names: str) -> None:
    for key in ("initContainers", "containers"):
        if key in pod:
            pod[key] = [c for c in pod[key] if c["name"] not in names]
            if not pod[key] and key == "initContainers":
                del pod[key]
