"""Bad input on the real control plane, with one operator for every case (bad_input_cases.py): each
invalid ClusterPolicy or NVIDIADriver is either refused by the apiserver with a message naming the
field, or stored and reported by the operator in status, with nothing applied for it. Afterwards
the operator is still the same process and reconciles a valid policy.

The table of cases in docs/reliability.md is generated from the run: `UPDATE_GOLDEN=1` rewrites
it (the test then reports as skipped, naming the file); without it a stale table fails the test.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError

from gpu_operator.kube.client import ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.integration.bad_input_cases import CASES, CP, REJECTED, REPORTED, Case
from tests.support.owned import owned_by
from tests.support.status import condition, driver_status, policy_status, reconciled
from tests.support.waiting import wait_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
START, END = "<!-- bad-input-table:start -->", "<!-- bad-input-table:end -->"


@dataclass
class Result:
    case: Case
    outcome: str
    message: str


def _resource(kind: str) -> Any:
    return ClusterPolicyResource if kind == CP else NVIDIADriverResource


def _gone(kube: Client, kind: str, name: str) -> bool:
    try:
        kube.get(_resource(kind), name)
    except ApiError as err:
        if err.status.code == 404:
            return True
        raise
    return False


def _reported(kube: Client, case: Case, name: str, operator: OperatorProcess) -> str:
    def error() -> str:
        status = policy_status(kube, name) if case.kind == CP else driver_status(kube, name)
        found = condition(status, "Error")
        return (
            str(found.get("message", ""))
            if found.get("status") == "True" and found.get("reason") == "ReconcileFailed"
            else ""
        )

    return wait_for(
        f"{case.kind} {name} ({case.case}) reported in status", error, timeout=60, context=operator.log_text
    )


def run_case(kube: Client, case: Case, name: str, operator: OperatorProcess) -> Result:
    api_version = "nvidia.com/v1" if case.kind == CP else "nvidia.com/v1alpha1"
    try:
        created = kube.create(
            _resource(case.kind)(
                apiVersion=api_version, kind=case.kind, metadata={"name": name}, spec=case.spec
            )
        )
    except ApiError as err:
        assert err.status.code == 422, (case, err.status)
        message = str(err.status.message)
        return Result(case, REJECTED, _apiserver_message(message))
    uid = created.metadata.uid
    try:
        message = _reported(kube, case, name, operator)
        assert owned_by(kube, uid) == [], f"{case.case}: objects applied for an invalid {case.kind}"
    finally:
        kube.delete(_resource(case.kind), name)
        wait_for(f"{case.kind} {name} deleted", lambda: _gone(kube, case.kind, name))
    return Result(case, REPORTED, message)


def _apiserver_message(text: str) -> str:
    """The field errors of a 422, without the object's name and the note on skipped CEL rules."""
    text = text.split(" is invalid: ", 1)[-1]
    if text.startswith("["):
        text = text[1:].split(", <nil>: Invalid value: null: some validation rules", 1)[0].rstrip("]")
    return text


def _cell(text: str, limit: int = 150) -> str:
    text = re.sub(r"x{200,}", lambda m: f"x…({len(m.group(0))} characters)", text)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("|", "\\|").replace("\n", " ")


def table(results: list[Result]) -> str:
    rejected = sum(r.outcome == REJECTED for r in results)
    lines = [
        f"{len(results)} cases: {rejected} rejected by the apiserver, {len(results) - rejected} reported in "
        "status by the operator (with nothing applied for them).",
        "",
        "| # | case | kind | input (spec) | outcome | message |",
        "|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(results, 1):
        spec = json.dumps(r.case.spec, separators=(",", ":"))
        if r.case.name:
            spec = f"metadata.name {r.case.name!r}"
        lines.append(
            f"| {index} | {_cell(r.case.case)} | {r.case.kind} | `{_cell(spec, 90)}` | {r.outcome} | "
            f"{_cell(r.message)} |"
        )
    return "\n".join(lines)


def _doc_table(text: str) -> str:
    if START not in text or END not in text:
        return ""
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def _write_table(generated: str) -> None:
    text = DOC.read_text() if DOC.exists() else "# Reliability\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + START + "\n" + generated + "\n" + END + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + START + "\n" + generated + "\n" + END + "\n"
    DOC.write_text(text)


def test_invalid_objects_are_rejected_or_reported(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
) -> None:
    fake_nodes("dgx-h100:1")
    operator = start_operator()
    pid = operator.process.pid if operator.process else None
    results: list[Result] = []
    wrong: list[str] = []
    for index, case in enumerate(CASES, 1):
        name = case.name or f"bad-input-{index:02d}"
        result = run_case(kube, case, name, operator)
        results.append(result)
        if result.outcome != case.outcome:
            wrong.append(
                f"{case.case}: expected {case.outcome}, got {result.outcome}: {result.message[:200]}"
            )
        elif case.where not in result.message:
            wrong.append(f"{case.case}: message does not name {case.where}: {result.message[:300]}")
        assert operator.alive, f"operator died at case {case.case!r}\n{operator.log_text()[-3000:]}"
    assert wrong == []
    assert operator.process is not None and operator.process.pid == pid
    assert "Traceback" not in operator.log_text()

    # Still working: a valid policy is reconciled and its objects are applied.
    name = cluster_policies({})
    reconciled(kube, name, context=operator.log_text)
    assert owned_by(kube, kube.get(ClusterPolicyResource, name).metadata.uid) != []

    generated = table(results)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        if _doc_table(DOC.read_text() if DOC.exists() else "") != generated:
            _write_table(generated)
            pytest.fail(
                f"rewrote the bad-input table in {DOC}: review the diff, then run again without UPDATE_GOLDEN"
            )
        return
    assert _doc_table(DOC.read_text() if DOC.exists() else "") == generated, (
        f"the bad-input table in {DOC} is stale: run UPDATE_GOLDEN=1 pytest {__file__}"
    )
    assert sum(r.outcome == REJECTED for r in results) + sum(r.outcome == REPORTED for r in results) >= 50
