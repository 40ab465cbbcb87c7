"""`gpu-operator render`: load a policy and nodes, render, print objects with a comment per state."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.render import RenderError, RenderResult, render
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.dra import RESOURCE_API_VERSIONS, DRAFacts, render_gpucluster
from gpu_operator.render.driverowners import conflict_message, route
from gpu_operator.render.facts import ClusterFacts, has_nfd_gpu_labels, operator_env
from gpu_operator.render.nvidiadriver import render_nvidiadriver
from gpu_operator.vocabulary import GPU_PRESENT


class InputError(ValueError):
    """A file or option the user gave is wrong; the message says which and how to fix it."""


def load_policy(path: Path) -> ClusterPolicy:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    policies = [d for d in docs if isinstance(d, dict) and d.get("kind") == "ClusterPolicy"]
    if len(policies) != 1:
        raise InputError(f"{path}: expected exactly one ClusterPolicy document, found {len(policies)}")
    return ClusterPolicy.model_validate(policies[0])


def load_gpucluster(path: Path) -> GPUCluster:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == "GPUCluster"]
    if len(found) != 1:
        raise InputError(
            f"{path}: expected exactly one GPUCluster document (kind: GPUCluster, apiVersion: "
            f"nvidia.com/v1alpha1), found {len(found)}"
        )
    return GPUCluster.model_validate(found[0])


def resource_api(version: str) -> str | None:
    """--resource-api v1|v1beta2|v1beta1|none -> the group-version (None: DRA not served)."""
    if version == "none":
        return None
    wanted = f"resource.k8s.io/{version}"
    if wanted not in RESOURCE_API_VERSIONS:
        choices = ", ".join(v.split("/")[1] for v in RESOURCE_API_VERSIONS)
        raise InputError(f"--resource-api {version}: choose one of {choices} or none")
    return wanted


def load_nodes(path: Path) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text()):
        items = doc if isinstance(doc, list) else (doc or {}).get("items", [doc]) if doc else []
        nodes.extend(item for item in items if isinstance(item, dict) and item.get("kind") == "Node")
    if not nodes:
        raise InputError(f"{path}: no Node objects found (give a YAML list, a v1 List or Node documents)")
    return nodes


def label_gpu_nodes(nodes: list[dict[str, Any]]) -> None:
    """What the operator's node labelling does first: NFD GPU labels -> nvidia.com/gpu.present=true."""
    for node in nodes:
        labels = node.setdefault("metadata", {}).setdefault("labels", {})
        if GPU_PRESENT not in labels and has_nfd_gpu_labels(labels):
            labels[GPU_PRESENT] = "true"


def format_yaml(result: RenderResult) -> str:
    lines: list[str] = []
    for warning in result.warnings:
        lines.append(f"# warning: {warning}")
    for state in result.states:
        status = "enabled" if state.enabled else "disabled"
        lines.append(f"# state {state.name}: {status} ({state.reason})")
        for obj in state.objects:
            lines.append("---")
            lines.append(yaml.safe_dump(obj, sort_keys=False, width=120).rstrip())
    return "\n".join(lines) + "\n"


def format_json(result: RenderResult) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": result.objects()}, indent=2) + "\n"


def load_nvidiadrivers(path: Path) -> list[NVIDIADriver]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == "NVIDIADriver"]
    if not found:
        raise InputError(
            f"{path}: no NVIDIADriver document found (kind: NVIDIADriver, apiVersion: nvidia.com/v1alpha1)"
        )
    drivers = []
    for doc in found:
        try:
            drivers.append(NVIDIADriver.model_validate(doc))
        except ValidationError as err:
            name = (doc.get("metadata") or {}).get("name", "?")
            raise InputError(f"{path}: NVIDIADriver {name!r} is not valid:\n{err}") from err
    names = [d.metadata.name for d in drivers]
    if len(set(names)) != len(names) or not all(names):
        raise InputError(f"{path}: every NVIDIADriver needs a distinct metadata.name (found {names})")
    return drivers


def render_drivers(
    drivers: list[NVIDIADriver], facts: ClusterFacts, base: ClusterPolicy | None
) -> RenderResult:
    """Every NVIDIADriver's objects, with GPU nodes routed to their owners as the operator does."""
    routing = route(drivers, {n.name: n.labels for n in facts.gpu_nodes})
    result = RenderResult(states=[])
    for node, names in sorted(routing.conflicts.items()):
        result.warnings.append(conflict_message(node, names))
    for nvd in drivers:
        one = render_nvidiadriver(nvd, facts, base, owned=routing.owned_by(nvd.metadata.name))
        result.states.extend(one.states)
        result.warnings.extend(one.warnings)
    return result


def run_render(
    *,
    policy: Path | None,
    nvidiadriver: Path | None,
    nodes: Path | None,
    shapes: list[str],
    namespace: str,
    output: str,
    k8s_version: str,
    openshift: bool,
    as_labelled: bool,
    gpucluster: Path | None = None,
    resource_api_version: str = "v1",
) -> int:
    from gpu_operator import shapes as node_shapes

    source = gpucluster or nvidiadriver or policy
    try:
        if output not in ("yaml", "json"):
            raise InputError(f"-o {output}: choose yaml or json")
        if gpucluster is not None:
            if policy is not None or nvidiadriver is not None:
                raise InputError(
                    "--gpucluster renders the DRA stack alone: a GPUCluster and a ClusterPolicy cannot "
                    "be active together (drop --policy/--nvidiadriver)"
                )
            facts_dra = DRAFacts(
                namespace=namespace,
                resource_api=resource_api(resource_api_version),
                openshift=openshift,
                operator_env=operator_env(os.environ, CHART_DEFAULT_IMAGES),
            )
            result = render_gpucluster(load_gpucluster(gpucluster), facts_dra)
            sys.stdout.write(format_yaml(result) if output == "yaml" else format_json(result))
            return 0
        if policy is None and nvidiadriver is None:
            raise InputError(
                "give --policy FILE (a ClusterPolicy), --nvidiadriver FILE (NVIDIADrivers), both, "
                "or --gpucluster FILE (a GPUCluster)"
            )
        cluster = load_nodes(nodes) if nodes else []
        cluster += node_shapes.nodes(shapes, settled=True)  # the steady state: GFD and the device plugin ran
        if as_labelled:
            label_gpu_nodes(cluster)
        facts = ClusterFacts.from_nodes(
            cluster,
            namespace=namespace,
            k8s_version=k8s_version,
            openshift=openshift,
            operator_env=operator_env(os.environ, CHART_DEFAULT_IMAGES),
        )
        base = load_policy(policy) if policy else None
        if nvidiadriver is not None:
            result = render_drivers(load_nvidiadrivers(nvidiadriver), facts, base)
        else:
            assert base is not None
            result = render(base, facts)
    except (InputError, node_shapes.ShapeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValidationError as err:
        kind = "GPUCluster" if gpucluster else "ClusterPolicy"
        print(f"error: {source} is not a valid {kind}:\n{err}", file=sys.stderr)
        return 2
    except RenderError as err:
        print(f"error: cannot render {source}: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(format_yaml(result) if output == "yaml" else format_json(result))
    return 0
