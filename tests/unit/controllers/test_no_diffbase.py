"""kopf's diff base is built empty: safe only while the operator registers no handler that reads
it (create/update/delete/resume/field handlers compare diff bases; indices and on.event do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import kopf

from gpu_operator.controllers.watches import NoDiffBase

SRC = Path(__file__).resolve().parents[3] / "src" / "gpu_operator" / "controllers"
CHANGING = {"create", "update", "delete", "resume", "field"}


def test_no_changing_handlers_are_registered() -> None:
    used = set()
    for path in SRC.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "on"
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "kopf"
            ):
                used.add(node.attr)
    assert used, "the scan found no kopf.on.* use at all: it no longer reads the code"
    assert used & CHANGING == set()


def test_the_essence_is_empty_and_costs_no_copy() -> None:
    body = kopf.Body({"metadata": {"name": "x", "labels": {"a": "b"}}, "spec": {"big": list(range(1000))}})
    assert NoDiffBase(prefix="gpu-operator").build(body=body) == {}
