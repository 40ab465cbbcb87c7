"""Helpers for the Helm chart tests: values layering, presets, and picking objects out of a render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[3] / "deployments" / "gpu-operator"
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


def find(rendered: Rendered, kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects(rendered) if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def notes(rendered: Rendered) -> str:
    return next(text for template, text in rendered.items() if template.endswith("NOTES.txt"))
