"""The images an install pulls, read from what would run: the chart's own objects (the operator
Deployment, its hook Jobs, node discovery) and every operand object our renderer makes of the
ClusterPolicy, NVIDIADrivers and GPUCluster among them, with the operator Deployment's env as the
operator's image fallbacks. Pure: the chart is rendered by the caller."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.render import render
from gpu_operator.render.clitext import label_gpu_nodes, render_drivers
from gpu_operator.render.dra import DRAFacts, render_gpucluster
from gpu_operator.render.facts import ClusterFacts, operator_env
from gpu_operator.render.result import Manifest, RenderError

# An env variable whose value is an image a pod pulls or hands on: VALIDATOR_IMAGE and
# CUDA_VALIDATOR_IMAGE (the validator's workload pods), the DRA controller's IMAGE_NAME (its
# ComputeDomain daemons). Not VALIDATOR_IMAGE_PULL_POLICY.
IMAGE_ENV = re.compile(r"(?:^|_)IMAGE(?:_NAME)?$")
POD_CONTAINER_KEYS = ("initContainers", "containers", "ephemeralContainers")
# The operator's own container: its env is what `gpu-operator run` reads as operand image fallbacks.
OPERATOR_COMMAND = ["gpu-operator", "run"]


class PolicyError(ValueError):
    """A policy the chart renders that our renderer rejects; `path` is its spec field."""

    def __init__(self, kind: str, path: str, message: str) -> None:
        super().__init__(f"{kind} {path}: {message}")
        self.kind, self.path, self.message = kind, path, message


@dataclass(frozen=True, order=True)
class ImageUse:
    """One image one container pulls (`env` empty) or hands on through an env variable."""

    image: str
    kind: str
    name: str
    container: str
    env: str = ""

    def where(self) -> str:
        return f"{self.kind}/{self.name} {self.container}" + (f" env {self.env}" if self.env else "")


def pod_specs(obj: Any) -> Iterator[dict[str, Any]]:
    """Every pod spec in an object, wherever it sits (a Deployment's template, a CronJob's job
    template, a Pod, an object of an extraObjects entry): a mapping with a list of containers."""
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            yield obj
            return
        for value in obj.values():
            yield from pod_specs(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from pod_specs(item)


def containers(pod: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for key in POD_CONTAINER_KEYS:
        yield from (c for c in pod.get(key) or [] if isinstance(c, dict))


def operator_container(objects: list[Manifest]) -> dict[str, Any] | None:
    """The container that runs `gpu-operator run` (the chart's Deployment), or None."""
    for obj in objects:
        if obj.get("kind") != "Deployment":
            continue
        for pod in pod_specs(obj.get("spec")):
            for ctr in containers(pod):
                if list(ctr.get("command") or [])[:2] == OPERATOR_COMMAND:
                    return ctr
    return None


def operator_images(objects: list[Manifest]) -> dict[str, str]:
    """The operand image fallbacks the operator would run with: its container's `*_IMAGE` env
    values, by the operator's own rule (render/facts.py operator_env)."""
    ctr = operator_container(objects) or {}
    env = {e["name"]: str(e["value"]) for e in ctr.get("env") or [] if isinstance(e, dict) and "value" in e}
    return operator_env(env)


def image_uses(objects: list[Manifest]) -> list[ImageUse]:
    """Every image the pods of `objects` pull, and every image-valued env variable they carry,
    except the operator's fallbacks (an operand the operator makes of one shows it in its own pod)."""
    fallbacks = operator_container(objects)
    uses: set[ImageUse] = set()
    for obj in objects:
        kind, meta = str(obj.get("kind", "")), obj.get("metadata") or {}
        name = (
            f"{meta['namespace']}/{meta.get('name', '')}"
            if meta.get("namespace")
            else str(meta.get("name", ""))
        )
        for pod in pod_specs(obj.get("spec")):
            for ctr in containers(pod):
                if ctr.get("image"):
                    uses.add(ImageUse(str(ctr["image"]), kind, name, str(ctr.get("name", ""))))
                if ctr is fallbacks:
                    continue
                for var in ctr.get("env") or []:
                    if (
                        isinstance(var, dict)
                        and IMAGE_ENV.search(str(var.get("name", "")))
                        and var.get("value")
                    ):
                        uses.add(
                            ImageUse(
                                str(var["value"]), kind, name, str(ctr.get("name", "")), str(var["name"])
                            )
                        )
    return sorted(uses)


def operand_objects(objects: list[Manifest], nodes: list[dict[str, Any]], namespace: str) -> list[Manifest]:
    """What the operator would apply for the policies among `objects` (a chart render) on a cluster
    of `nodes`: the ClusterPolicy's states, the NVIDIADrivers' DaemonSets, the GPUCluster's DRA
    stack. PolicyError names a policy field our renderer rejects."""
    images = operator_images(objects)
    labelled = copy.deepcopy(nodes)
    label_gpu_nodes(labelled)  # as the operator's node labelling does first
    facts = ClusterFacts.from_nodes(labelled, namespace=namespace, operator_env=images)
    policies = _load(objects, "ClusterPolicy", ClusterPolicy)
    drivers = _load(objects, "NVIDIADriver", NVIDIADriver)
    clusters = _load(objects, "GPUCluster", GPUCluster)
    out: list[Manifest] = []
    try:
        for policy in policies:
            out += render(policy, facts).objects()
        if drivers:
            out += render_drivers(drivers, facts, policies[0] if policies else None).objects()
        for cluster in clusters:
            out += render_gpucluster(cluster, DRAFacts(namespace=namespace, operator_env=images)).objects()
    except RenderError as err:
        kind = "GPUCluster" if clusters and not policies else "ClusterPolicy"
        raise PolicyError(kind, err.field_path, err.message) from err
    return out


def _load(objects: list[Manifest], kind: str, model: Any) -> list[Any]:
    found = []
    for obj in objects:
        if obj.get("kind") != kind:
            continue
        try:
            found.append(model.model_validate(obj))
        except ValidationError as err:
            first = err.errors()[0]
            path = ".".join(str(p) for p in first["loc"])
            raise PolicyError(kind, path, str(first["msg"])) from err
    return found
