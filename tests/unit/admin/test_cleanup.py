"""`gpu-operator cleanup` (admin/cleanup.py): only the nodes a driver upgrade cordoned are
uncordoned, and its help names every kind it deletes."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.admin.cleanup import cordoned_by_us
from gpu_operator.cli import app
from gpu_operator.controllers.cleanup import OWNER_KINDS


def _upgrading(state: str, unschedulable: bool, initially: str | None = None) -> dict[str, Any]:
    annotations = {} if initially is None else {"nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable": initially}
    return {"metadata": {"name": "n", "labels": {"nvidia.com/gpu-driver-upgrade-state": state} if state else {},
                         "annotations": annotations},
            "spec": {"unschedulable": unschedulable}}


@pytest.mark.parametrize(("node", "ours"), [
    (_upgrading("wait-for-jobs-required", True), True),
    (_upgrading("drain-required", True, "false"), True),  # `upgrade retry` of a node we cordoned
    (_upgrading("upgrade-failed", True), True),
    (_upgrading("validation-required", True, "true"), False),  # cordoned before the upgrade began
    (_upgrading("upgrade-required", True), False),  # not cordoned by us yet: a user's cordon
    (_upgrading("cordon-required", True), False),
    (_upgrading("upgrade-done", True), False),
    (_upgrading("", True), False),
    (_upgrading("wait-for-jobs-required", False), False),
])
def test_only_nodes_the_upgrade_cordoned_are_uncordoned(node: dict[str, Any], ours: bool) -> None:
    assert cordoned_by_us(node) is ours


def test_cleanup_help_names_every_kind_it_deletes() -> None:
    text = " ".join(CliRunner().invoke(app, ["cleanup", "--help"]).output.replace("│", "").split())
    assert [kind for _, kind in OWNER_KINDS if kind not in text] == [], text
