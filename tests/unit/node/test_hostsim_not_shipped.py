"""The host simulators are test support: the shipped package neither contains nor imports them."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "gpu_operator"


def test_shipped_package_has_no_simulator_and_never_imports_tests() -> None:
    # in any room of node/ (or anywhere else in the package)
    assert [p for name in ("fakehost.py", "kernelsim.py") for p in SRC.rglob(name)] == []
    offenders = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.relative_to(SRC)}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert offenders == []
