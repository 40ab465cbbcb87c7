"""OperatorSettings: one typed object, a docstring per field, documented in docs/operator.md; the
capped exponential backoff every retry uses."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from gpu_operator.controllers.settings import Backoff, OperatorSettings

DOCS = Path(__file__).resolve().parents[3] / "docs" / "operator.md"


def test_backoff_doubles_from_initial_up_to_the_cap() -> None:
    backoff = Backoff(initial=1.0, cap=60.0)
    assert [backoff.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.delay(10_000) == 60.0


def _field_docstrings(cls: type) -> dict[str, str]:
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            docs[node.target.id] = str(after.value.value)
    return docs


def test_every_setting_has_a_docstring_and_a_row_in_the_docs() -> None:
    names = [f.name for f in dataclasses.fields(OperatorSettings)]
    docs = _field_docstrings(OperatorSettings)
    assert [n for n in names if not docs.get(n, "").strip()] == []
    table = DOCS.read_text()
    assert [n for n in names if f"| `{n}` |" not in table] == []


def test_the_cli_renew_deadline_keeps_the_lease_five_seconds_longer() -> None:
    settings = OperatorSettings.with_renew_deadline(20.0, label_concurrency=8)
    assert (settings.leader_renew_deadline, settings.leader_lease_duration) == (20.0, 25.0)
    assert settings.label_concurrency == 8
    assert OperatorSettings().leader_lease_duration == 15.0
