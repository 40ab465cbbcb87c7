"""docs/architecture.md's layers, as data: which rooms each room may import, and no import loop
between modules. Read from the source (tests/support/imports.py), function-level imports too."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.imports import modules, references

ROOT = Path(__file__).resolve().parents[2]

# room -> the rooms it may import (besides itself and the package root: __version__).
MAY_IMPORT: dict[str, set[str]] = {
    "vocabulary": set(),
    "api": {"vocabulary"},
    "shapes": {"vocabulary"},
    "render": {"vocabulary", "api", "shapes"},  # pure: no kube, no I/O room
    "kube": {"vocabulary", "api"},
    "node": {"vocabulary"},  # node agents: never controllers or render
    "statusview": {"vocabulary", "api", "shapes", "render", "kube"},
    "controllers": {"vocabulary", "api", "shapes", "render", "kube", "statusview"},
    "sim": {"vocabulary", "api", "shapes", "render", "kube", "node", "statusview"},  # runs the operator, never imports it
    "cli": {"vocabulary", "api", "shapes", "render", "kube", "node", "statusview", "controllers", "sim"},
}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph() -> dict[str, set[str]]:
    known = modules()
    return {name: references(name, path, known) - {name} for name, path in known.items()}


def test_every_room_is_in_the_rules() -> None:
    rooms = {room(m) for m in modules()} - {""}
    assert rooms == set(MAY_IMPORT), "a room without rules (add it to MAY_IMPORT and docs/architecture.md)"


def test_an_import_only_points_down() -> None:
    upward = sorted(f"{m} -> {t}" for m, targets in _graph().items() for t in targets
                    if room(t) not in ({room(m), ""} | MAY_IMPORT[room(m)]))
    assert upward == [], "imports against docs/architecture.md's layers:\n" + "\n".join(upward)


def test_no_import_loop_between_modules() -> None:
    graph = _graph()
    # A package imports its own submodules (re-exports); a loop through a package's __init__
    # is a loop only if a submodule imports the package back.
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    loops = _cycles(edges)
    assert loops == [], "import loops:\n" + "\n".join(" -> ".join(c) for c in loops)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_architecture_page_lists_every_room() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Layers"):text.index("## From a ClusterPolicy")]
    listed = set(re.findall(r"^(\w+)(?:/|\.py)", block, flags=re.M))
    assert set(MAY_IMPORT) - {"cli"} <= listed, set(MAY_IMPORT) - listed


def test_only_kube_speaks_http() -> None:
    """No request is sent from controllers/ itself (kube/ holds the client, the watches, the lists,
    the eviction), and no wire decoder lives there."""
    root = Path(__file__).resolve().parents[2] / "src" / "gpu_operator" / "controllers"
    sending = re.compile(r"\.http\.(get|post|put|patch|delete|stream|request)\(")
    found = [f"{path.name}:{n}" for path in sorted(root.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if sending.search(line) or re.match(r"\s*(import msgspec|from msgspec)", line)]
    assert found == [], f"HTTP or wire decoding in controllers/: {found}; move it to kube/"
