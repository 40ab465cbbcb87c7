"""One name, one type: no class or type alias is defined in two modules of src/ (issue 59).

Two `NodeView`s or two `ConfigError`s make a reader (and a grep) guess which one a module means,
and an import of the wrong one type-checks as often as not. A class counts wherever it is
defined in a module (nested ones too); a type alias is a module-level CapWords name bound to a
type expression (`X: TypeAlias = ...`, `X = Callable[...]`, `X = Annotated[...]`, `X = A | B`,
`X = other.Name`). Type variables (`T = TypeVar(...)`) are parameters, not types, and may repeat.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# name -> why it may be defined in more than one module. Empty: every collision so far was two
# different things under one name, renamed to say which (6b3174e, 1ab9f0b and this test's commit).
ALLOWED: dict[str, str] = {}


def _is_type_alias(node: ast.stmt) -> str | None:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id if "TypeAlias" in ast.unparse(node.annotation) else None
    if not (
        isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    ):
        return None
    name = node.targets[0].id
    capwords = name[:1].isupper() and not name.isupper()
    typed = isinstance(node.value, ast.Subscript | ast.BinOp | ast.Name | ast.Attribute)
    return name if capwords and typed else None


def definitions(tree: ast.Module) -> set[str]:
    """The classes (at any depth) and module-level type aliases a module defines."""
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    names |= {alias for node in tree.body if (alias := _is_type_alias(node))}
    return names


def collisions(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each name defined in more than one of `sources` (module path -> text), with its modules."""
    where: dict[str, list[str]] = defaultdict(list)
    for path, text in sorted(sources.items()):
        for name in definitions(ast.parse(text, filename=path)):
            where[name].append(path)
    return {name: paths for name, paths in sorted(where.items()) if len(paths) > 1}


def test_no_class_or_type_alias_is_defined_in_two_modules() -> None:
    sources = {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.py"))}
    found = collisions(sources)
    assert {name: paths for name, paths in found.items() if name not in ALLOWED} == {}, (
        "rename where each is defined and in every user, to say which it is"
    )
    assert sorted(set(ALLOWED) - set(found)) == [], "an allowed name no longer collides: drop it"


def test_the_scan_finds_classes_aliases_and_not_type_variables() -> None:
    sources = {
        "a.py": "from typing import TypeVar\nT = TypeVar('T')\nclass Model: ...\nGate = Callable[[int], bool]\n",
        "b.py": "from typing import TypeVar\nT = TypeVar('T')\nclass Outer:\n    class Model: ...\n",
        "c.py": "Gate = int | None\nLIMIT = 3\nrows = list\n",
    }
    assert collisions(sources) == {"Gate": ["a.py", "c.py"], "Model": ["a.py", "b.py"]}
