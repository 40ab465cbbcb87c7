"""The Helm chart rendered offline by Helm's own engine (helm-python-sdk), for unit and integration tests:
values layering, presets, and picking objects out of a render. One render path for every test."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Namespace

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.helm import release_names
from tests.support.cleanup import delete_if_present
from tests.support.events import namespace_story
from tests.support.helm_cli import HelmCLI

CHART = Path(__file__).resolve().parents[2] / "deployments" / "gpu-operator"
NAMESPACE = "gpu-operator"
PRESETS = ("container", "passthrough", "vgpu")
# The vGPU manager image is the user's own build; the vgpu preset needs it named.
VGPU_IMAGE = {"vgpuManager": {"repository": "registry.example.com/nvidia", "version": "17.4"}}

Values = dict[str, Any]
Rendered = dict[str, str]


def deep_merge(base: Values, override: Values) -> Values:
    """Layer values files the way `helm -f a.yaml -f b.yaml` does: maps merge, the rest is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_chart(
    values: Values | None = None, *, namespace: str = NAMESPACE, chart: helm_python.Chart | None = None
) -> Rendered:
    """{template path: manifest}, as `helm template` with nfd disabled unless `values` say otherwise.

    nfd.enabled adds the node-discovery DaemonSet (tests/unit/chart/test_node_discovery.py tests
    it); the other tests look at the rest. Pass an already loaded `chart` to save loading it per
    render (the unit tests' session fixture does).
    """
    layered = deep_merge({"nfd": {"enabled": False}}, values or {})
    if chart is not None:
        rendered: Rendered = chart.render(layered, name="gpu-operator", namespace=namespace, is_install=True)
        return rendered
    with helm_python.Chart.load(CHART) as loaded:
        return render_chart(values, namespace=namespace, chart=loaded)


def preset(name: str) -> Values:
    loaded: Values = yaml.safe_load((CHART / f"values-{name}.yaml").read_text())
    return loaded


def objects(rendered: Rendered) -> list[dict[str, Any]]:
    """Every Kubernetes object of a render (NOTES.txt and empty documents left out)."""
    found: list[dict[str, Any]] = []
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def find(rendered: Rendered | list[dict[str, Any]], kind: str, name: str = "gpu-operator") -> dict[str, Any]:
    """The one object of that kind and name, from a render or a list of objects."""
    found = objects(rendered) if isinstance(rendered, dict) else rendered
    matches = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def notes(rendered: Rendered) -> str:
    return next(text for template, text in rendered.items() if template.endswith("NOTES.txt"))


@contextlib.contextmanager
def real_nodes_cordoned(kube: Client) -> Iterator[list[str]]:
    """Every Node not played by kwok (the real-node tests' session node, left on the plane for the
    tests after them) cordoned meanwhile, so that a chart's hook Jobs' pods (and its operator pod)
    go to kwok nodes: on the real node they would really run, with no route to this apiserver
    (no kube-proxy) and images the chart names from a registry this machine lacks, and `helm`
    would wait out its timeout on a hook Job that never completes. Uncordoned afterwards."""
    from lightkube.resources.core_v1 import Node

    from gpu_operator.shapes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE

    real = [
        str(n.metadata.name)
        for n in kube.list(Node)
        if n.metadata
        and not (n.spec and n.spec.unschedulable)
        and (n.metadata.annotations or {}).get(KWOK_ANNOTATION) != KWOK_ANNOTATION_VALUE
    ]
    for name in real:
        kube.patch(Node, name, {"spec": {"unschedulable": True}})
    try:
        yield real
    finally:
        for name in real:
            kube.patch(Node, name, {"spec": {"unschedulable": None}})


@contextlib.contextmanager
def helm_in(
    plane: ControlPlane,
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    namespace: str,
    release: str = "gpu-operator",
) -> Iterator[helm_python.Config]:
    """Real Helm against `plane` for releases in `namespace`, with a kwok node (`fake_nodes`, the
    integration fixture) where kwok completes the chart's hook Job pods, and any real node
    cordoned meanwhile (`real_nodes_cordoned`); afterwards `release`, in whatever state it was
    left (a failed install too), is uninstalled and the namespace deleted."""
    fake_nodes("cpu:1")
    with real_nodes_cordoned(kube):
        config = helm_python.Config(kubeconfig_path=plane.admin_kubeconfig, namespace=namespace)
        try:
            yield config
        finally:
            if release in release_names(config):
                config.uninstall(release, timeout=180)
            delete_if_present(kube, Namespace, namespace)


@contextlib.contextmanager
def helm_on_kwok(
    major: int, control_plane: ControlPlane, kube: Client, namespace: str, workdir: Path
) -> Iterator[HelmCLI]:
    """The helm command line of one major for `namespace` (its failures tell the namespace's
    story), with any real node cordoned meanwhile (`real_nodes_cordoned`): the chart's hook Jobs'
    pods go to a kwok node, which the caller provides. What a test leaves is the caller's to
    remove, before this returns."""
    cli = HelmCLI(
        major,
        control_plane.admin_kubeconfig,
        namespace,
        workdir,
        story=lambda: namespace_story(kube, namespace),
    )
    with real_nodes_cordoned(kube):
        yield cli
