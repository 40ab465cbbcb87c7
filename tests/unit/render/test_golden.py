"""Golden rendered YAML: every example policy (examples/*.yaml) on every node shape, one file per state.

The files live in tests/unit/render/golden/<policy>--<shape>/<state>.yaml, where <policy> is the
example's file name without `clusterpolicy-` and `.yaml`. Each file is what `gpu-operator render`
prints for that state: a comment saying whether the state is enabled and why, the references it
deletes, then its objects. A change to a render shows up as a unified diff naming the state.

When a render changes on purpose, regenerate every golden file (and drop the stale ones) with

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/render/test_golden.py

and review `git diff tests/unit/render/golden` before committing. Tests whose files were rewritten
report as skipped (saying what they rewrote), never as passed; run once more without the variable.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from gpu_operator import shapes
from gpu_operator.render import RenderResult, render
from gpu_operator.render.clitext import format_yaml, label_gpu_nodes, load_policy
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import ClusterFacts

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("clusterpolicy-*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
SHAPES = shapes.names()
UPDATE = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")
# Fixed inputs, so the files depend on the code alone (not on *_IMAGE variables of the caller).
NAMESPACE = "gpu-operator"
K8S_VERSION = "1.36.0"


def policy_name(example: Path) -> str:
    return example.stem.removeprefix("clusterpolicy-")


def rendered_states(example: Path, shape: str) -> dict[str, str]:
    """{state name: file text} for one example policy on one node of one shape."""
    nodes = shapes.nodes([f"{shape}:1"])
    label_gpu_nodes(nodes)
    facts = ClusterFacts.from_nodes(nodes, namespace=NAMESPACE, k8s_version=K8S_VERSION,
                                    operator_env=dict(CHART_DEFAULT_IMAGES))
    result = render(load_policy(example), facts)
    texts = {state.name: format_yaml(RenderResult([state])) for state in result.states}
    if result.warnings:
        texts["warnings"] = format_yaml(RenderResult([], warnings=result.warnings))
    return texts


def test_examples_and_shapes_exist() -> None:
    assert len(EXAMPLES) >= 4 and len(SHAPES) >= 4, (EXAMPLES, SHAPES)


def test_no_golden_directory_without_a_policy_and_shape() -> None:
    wanted = {f"{policy_name(e)}--{s}" for e in EXAMPLES for s in SHAPES}
    stale = sorted(d.name for d in GOLDEN.iterdir() if d.is_dir() and d.name not in wanted)
    if stale and UPDATE:
        for name in stale:
            for file in (GOLDEN / name).iterdir():
                file.unlink()
            (GOLDEN / name).rmdir()
        pytest.fail(f"removed stale golden directories {stale}: run again without UPDATE_GOLDEN")
    assert stale == [], f"golden directories for no example policy and shape: {stale}; run UPDATE_GOLDEN=1"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("example", EXAMPLES, ids=policy_name)
def test_render_matches_golden(example: Path, shape: str) -> None:
    folder = GOLDEN / f"{policy_name(example)}--{shape}"
    actual = rendered_states(example, shape)
    expected = {f.stem: f.read_text() for f in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}
    changed = sorted(name for name in actual.keys() | expected.keys() if actual.get(name) != expected.get(name))
    if not changed:
        return
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for name in changed:
            path = folder / f"{name}.yaml"
            if name in actual:
                path.write_text(actual[name])
            else:
                path.unlink()
        pytest.fail(f"rewrote {folder.relative_to(ROOT)}: {', '.join(changed)}; review the diff, then run again "
                    "without UPDATE_GOLDEN")
    report = []
    for name in changed:
        where = f"{folder.relative_to(ROOT)}/{name}.yaml"
        diff = difflib.unified_diff(expected.get(name, "").splitlines(keepends=True),
                                    actual.get(name, "").splitlines(keepends=True),
                                    fromfile=f"{where} (golden)", tofile=f"{where} (rendered)")
        report.append(f"state {name} of {policy_name(example)} on {shape} differs:\n{''.join(diff)}")
    pytest.fail("\n".join(report) + "\nIf the change is intended: UPDATE_GOLDEN=1 .venv/bin/pytest "
                "tests/unit/render/test_golden.py, then review git diff tests/unit/render/golden", pytrace=False)
