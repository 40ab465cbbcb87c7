"""The operator's inputs are read once: the process environment only where the process starts
(the run command, kopf's login, controllers/environment.py), never by a unit or a reconciler."""

from __future__ import annotations

import ast
from pathlib import Path

CONTROLLERS = Path(__file__).resolve().parents[3] / "src" / "gpu_operator" / "controllers"
# where the process starts: the run command builds the Environment, run.py hands kopf its
# kubeconfig, kopf's login reads the in-cluster service address as kopf would
START = {"cli.py", "run.py", "kopflogin.py", "environment.py"}


def reads_environment(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in ("environ", "getenv") for alias in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_no_unit_or_reconciler_reads_the_process_environment() -> None:
    found = {
        str(p.relative_to(CONTROLLERS)): lines
        for p in sorted(CONTROLLERS.rglob("*.py"))
        if p.name not in START or p.parent != CONTROLLERS
        if (lines := reads_environment(p))
    }
    assert found == {}, (
        f"environment read outside the start-up modules (use controllers/environment.py): {found}"
    )


def test_the_scan_finds_a_read(tmp_path: Path) -> None:
    planted = tmp_path / "planted_env.py"
    planted.write_text("import os\nfrom os import getenv\n\nIMAGE = os.environ.get('DRIVER_IMAGE')\n")
    assert sorted(reads_environment(planted)) == [2, 4]
