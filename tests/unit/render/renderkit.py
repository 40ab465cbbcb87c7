"""Helpers shared by the render tests: facts from the node shapes, chart-default images, validation."""

from __future__ import annotations

from typing import Any

from gpu_operator import shapes
from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.render import RenderResult, dra, render
from gpu_operator.render.clitext import label_gpu_nodes
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import ClusterFacts
from gpu_operator.render.states import ORDER

IMAGES = {**CHART_DEFAULT_IMAGES, "VGPU_MANAGER_IMAGE": "registry.example.com/nvidia/vgpu-manager:595.91.07"}
K8S = "1.36.3"
# The ClusterPolicy's states and the GPUCluster's, in render order
STATE_NAMES: tuple[str, ...] = tuple(operand.state for operand in ORDER)
DRA_STATE_NAMES: tuple[str, ...] = tuple(name for name, _, _ in dra.STATES)


def nodes(*specs: str, labelled: bool = True) -> list[dict[str, Any]]:
    out = shapes.nodes(list(specs), settled=True)  # as `render --shape` sees them
    if labelled:
        label_gpu_nodes(out)
    return out


def facts(*specs: str, labelled: bool = True, **kwargs: Any) -> ClusterFacts:
    kwargs.setdefault("operator_env", IMAGES)
    return ClusterFacts.from_nodes(
        nodes(*specs, labelled=labelled), namespace="gpu-operator", k8s_version=K8S, **kwargs
    )


def policy(spec: dict[str, Any] | None = None) -> ClusterPolicy:
    return ClusterPolicy.model_validate({"metadata": {"name": "cluster-policy"}, "spec": spec or {}})


def run(spec: dict[str, Any] | None = None, *node_specs: str, **kwargs: Any) -> RenderResult:
    return render(policy(spec), facts(*(node_specs or ("dgx-h100:2",)), **kwargs))


def daemonset(result: RenderResult, state: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in result.state(state).objects
        if o["kind"] == "DaemonSet" and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, [o["metadata"]["name"] for o in found]
    return found[0]


def ctr(ds: dict[str, Any], name: str) -> dict[str, Any]:
    pod = ds["spec"]["template"]["spec"]
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if c["name"] == name:
            found: dict[str, Any] = c
            return found
    raise AssertionError(f"no container {name}")


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from>") for e in container.get("env", [])}
