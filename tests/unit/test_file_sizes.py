"""The house rule on module size: no source file over 500 lines (split it along a responsibility).
Held for everything under src/ and for our own tooling in Python (bench/, tools/)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500


def _too_long(root: Path, folders: tuple[str, ...]) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > LIMIT:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_no_source_file_is_over_the_limit() -> None:
    assert _too_long(ROOT, ("src", "bench", "tools")) == [], f"split these files (limit {LIMIT} lines)"


def test_the_rule_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "src" / "short.py").write_text("x = 1\n" * LIMIT)
    assert _too_long(tmp_path, ("src",)) == [f"src/long.py: {LIMIT + 1} lines"]
