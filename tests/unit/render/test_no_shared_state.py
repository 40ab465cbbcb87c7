"""Rendering leaves the renderer as it found it: no module-level constant (volumes, mounts, rules,
templates) is changed by a render, so one policy's settings never leak into the next render in
the same operator process (a policy's hostPaths.rootFS once stayed in every later toolkit
DaemonSet: the volume constants were mutated in place by the transforms)."""

from __future__ import annotations

import copy
import importlib
import pkgutil
from typing import Any

import gpu_operator.render as render_pkg
from tests.unit.render.renderkit import run
from tests.unit.render.test_render import CONFIGMAP_KEYS, EVERYTHING


def _constants() -> dict[str, Any]:
    """Every module-level dict or list of the render package, by qualified name (deep copies)."""
    found = {}
    for info in pkgutil.walk_packages(render_pkg.__path__, render_pkg.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, dict | list) and not name.startswith("__"):
                found[f"{info.name}.{name}"] = copy.deepcopy(value)
    return found


def test_a_render_changes_no_module_constant() -> None:
    run({})  # imports everything a render uses
    before = _constants()
    assert len(before) > 20, "found too few constants: the walk is broken"
    run(EVERYTHING, configmap_keys=CONFIGMAP_KEYS)
    run(EVERYTHING, "vfio-passthrough:1", "host-driver:1", configmap_keys=CONFIGMAP_KEYS)
    after = _constants()
    changed = sorted(name for name in before if before[name] != after.get(name))
    assert changed == [], f"a render changed module constants: {changed}"


def test_the_same_policy_renders_the_same_objects_whatever_came_before() -> None:
    first = run({}).objects()
    run(EVERYTHING, configmap_keys=CONFIGMAP_KEYS)
    assert run({}).objects() == first
