"""Golden rendered YAML: every example policy (examples/*.yaml) on every node shape, per state.

What `gpu-operator render` prints for one state (a comment saying whether the state is enabled and
why, then its objects) is stored once per distinct text: tests/unit/render/golden/<state>/<case>.yaml,
named after the first case (`<policy>--<shape>`, <policy> being the example's file name without
`clusterpolicy-` and `.yaml`) that renders it. golden/cases.yaml is the table of which file each
case's state matches, so cases that render the same text share one file. A change to a render
shows up as a unified diff naming the case and the state.

When a render changes on purpose, regenerate the files and the table (stale files are removed) with

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/render/test_golden.py

and review `git diff tests/unit/render/golden` before committing. A run that rewrote anything fails
on purpose, naming what it rewrote (never a pass); run once more without the variable.
"""

from __future__ import annotations

import difflib
import os
from functools import cache
from pathlib import Path

import pytest
import yaml

from gpu_operator import shapes
from gpu_operator.render import RenderResult, render
from gpu_operator.render.clitext import format_yaml, label_gpu_nodes, load_policy
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import ClusterFacts

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("clusterpolicy-*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
TABLE = GOLDEN / "cases.yaml"
SHAPES = shapes.names()
UPDATE = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")
# Fixed inputs, so the files depend on the code alone (not on *_IMAGE variables of the caller).
NAMESPACE = "gpu-operator"
K8S_VERSION = "1.36.0"


def policy_name(example: Path) -> str:
    return example.stem.removeprefix("clusterpolicy-")


def case_name(example: Path, shape: str) -> str:
    return f"{policy_name(example)}--{shape}"


def rendered_states(example: Path, shape: str) -> dict[str, str]:
    """{state name: file text} for one example policy on one node of one shape."""
    nodes = shapes.nodes([f"{shape}:1"], settled=True)  # as `render --shape` sees them
    label_gpu_nodes(nodes)
    facts = ClusterFacts.from_nodes(
        nodes, namespace=NAMESPACE, k8s_version=K8S_VERSION, operator_env=dict(CHART_DEFAULT_IMAGES)
    )
    result = render(load_policy(example), facts)
    texts = {state.name: format_yaml(RenderResult([state])) for state in result.states}
    if result.warnings:
        texts["warnings"] = format_yaml(RenderResult([], warnings=result.warnings))
    return texts


def stored(table: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """{case: {state: golden file name}} -> {case: {state: text}} (files read once each)."""
    texts = {
        name: (GOLDEN / name).read_text()
        for name in {f for states in table.values() for f in states.values()}
    }
    return {case: {state: texts[f] for state, f in states.items()} for case, states in table.items()}


def layout(rendered: dict[str, dict[str, str]]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Every case's render -> (the table, {golden file name: text}): one file per distinct text of
    a state, named after the first case (sorted) that renders it."""
    table: dict[str, dict[str, str]] = {}
    files: dict[str, str] = {}
    first: dict[tuple[str, str], str] = {}
    for case in sorted(rendered):
        for state, text in sorted(rendered[case].items()):
            name = first.setdefault((state, text), f"{state}/{case}.yaml")
            files[name] = text
            table.setdefault(case, {})[state] = name
    return table, files


@cache
def _table() -> dict[str, dict[str, str]]:
    loaded = yaml.safe_load(TABLE.read_text()) if TABLE.exists() else {}
    return dict(loaded or {})


def test_examples_and_shapes_exist() -> None:
    assert len(EXAMPLES) >= 4 and len(SHAPES) >= 4, (EXAMPLES, SHAPES)


def test_the_table_covers_every_case_and_every_file_is_used() -> None:
    wanted = {case_name(e, s) for e in EXAMPLES for s in SHAPES}
    if UPDATE:
        rendered = {case_name(e, s): rendered_states(e, s) for e in EXAMPLES for s in SHAPES}
        table, files = layout(rendered)
        old = {str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("*.yaml") if p != TABLE}
        changed = sorted(
            n for n, text in files.items() if not (GOLDEN / n).exists() or (GOLDEN / n).read_text() != text
        )
        removed = sorted(old - set(files))
        table_text = yaml.safe_dump(table, sort_keys=True)
        if not changed and not removed and TABLE.exists() and TABLE.read_text() == table_text:
            return
        for name in removed:
            (GOLDEN / name).unlink()
        for name in changed:
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(files[name])
        for folder in sorted((p for p in GOLDEN.rglob("*") if p.is_dir()), reverse=True):
            if not any(folder.iterdir()):
                folder.rmdir()
        TABLE.write_text(table_text)
        pytest.fail(
            f"rewrote the golden files: {len(changed)} written, {len(removed)} removed "
            f"({', '.join((changed + removed)[:10])}...); review the diff, then run again without UPDATE_GOLDEN"
        )
    table = _table()
    assert set(table) == wanted, (
        f"cases missing or stale in {TABLE.name}: {sorted(set(table) ^ wanted)}; run UPDATE_GOLDEN=1"
    )
    used = {f for states in table.values() for f in states.values()}
    on_disk = {str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("*.yaml") if p != TABLE}
    assert used == on_disk, f"golden files unused or missing: {sorted(used ^ on_disk)}; run UPDATE_GOLDEN=1"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("example", EXAMPLES, ids=policy_name)
def test_render_matches_golden(example: Path, shape: str) -> None:
    if UPDATE:  # never a silent pass: the rewrite run fails as a whole and must be run again without it
        pytest.fail(
            "UPDATE_GOLDEN is set: test_the_table_covers_every_case_and_every_file_is_used rewrites the "
            "files; nothing is compared in this run. Run again without UPDATE_GOLDEN"
        )
    case = case_name(example, shape)
    actual = rendered_states(example, shape)
    files = _table().get(case, {})
    expected = stored({case: files})[case]
    changed = sorted(
        name for name in actual.keys() | expected.keys() if actual.get(name) != expected.get(name)
    )
    report = []
    for name in changed:
        where = f"tests/unit/render/golden/{files.get(name, f'{name}/(none)')}"
        diff = difflib.unified_diff(
            expected.get(name, "").splitlines(keepends=True),
            actual.get(name, "").splitlines(keepends=True),
            fromfile=f"{where} (golden)",
            tofile=f"{where} (rendered)",
        )
        report.append(f"state {name} of {case} differs:\n{''.join(diff)}")
    assert not report, (
        "\n".join(report) + "\nIf the change is intended: UPDATE_GOLDEN=1 .venv/bin/pytest "
        "tests/unit/render/test_golden.py, then review git diff tests/unit/render/golden"
    )
