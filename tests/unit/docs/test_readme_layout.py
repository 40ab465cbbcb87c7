"""The README's layout block and the tree stay in step: every room (package or top-level module)
of src/gpu_operator/ and every sub-room of controllers/ is listed, and every path the block names
exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "src" / "gpu_operator"


def layout_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```\n(src/gpu_operator/\n.*?)```", text, re.S)
    assert match, "README.md has no layout block starting with src/gpu_operator/"
    return match.group(1).splitlines()


def listed() -> tuple[set[str], set[str], list[str]]:  # rooms, other folders, the block
    """Rooms under src/gpu_operator/ (by indentation: two spaces a level), and every other path."""
    rooms: set[str] = set()
    others: list[str] = []
    parents: list[str] = []
    for line in layout_block()[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        words = line.split()
        if depth == 0:
            others.extend(w for w in words if w.endswith("/"))  # the folders a line names
            parents = []
            continue
        name = words[0]
        parents = parents[: depth - 1] + [name.rstrip("/")]
        rooms.add("/".join(parents))
    return rooms, set(others), layout_block()


def tree_rooms() -> set[str]:
    found = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found |= {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    found |= {
        f"controllers/{p.name}"
        for p in (PACKAGE / "controllers").iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    }
    return found


def test_every_room_of_the_package_is_in_the_layout_block_and_no_other() -> None:
    rooms, _, _ = listed()
    assert rooms == tree_rooms(), "README.md's layout block and src/gpu_operator/ differ"


def test_every_other_path_of_the_layout_block_exists() -> None:
    _, others, _ = listed()
    assert others, "the scan found no path outside the package: it no longer reads the block"
    missing = sorted(p for p in others if not (ROOT / p).exists())
    assert missing == [], f"README.md's layout block names paths that do not exist: {missing}"
