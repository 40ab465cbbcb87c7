"""The sim commands' --help says what a reader needs: every shape `--shape` takes, and the defaults
the help texts state (rich's markup would take a "[default: ...]" written into a help text for a
tag and print nothing)."""

from __future__ import annotations

import pytest
import typer
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

from gpu_operator import shapes
from gpu_operator.cli import app


def all_options() -> list[tuple[str, TyperOption]]:
    found: list[tuple[str, TyperOption]] = []

    def walk(command: object, path: str) -> None:
        found.extend((path, p) for p in getattr(command, "params", []) if isinstance(p, TyperOption))
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "gpu-operator")
    return found


def test_no_help_text_hides_a_default_in_markup() -> None:
    hidden = [f"{path} {opt.opts[0]}" for path, opt in all_options() if "[default" in (opt.help or "")]
    assert hidden == []


@pytest.mark.parametrize("command", ["up", "demo"])
def test_shape_help_lists_every_shape_and_the_default(command: str) -> None:
    out = CliRunner().invoke(app, ["sim", command, "--help"], env={"COLUMNS": "400"}).output
    line = next(ln for ln in out.splitlines() if "--shape" in ln)
    listed = line.split("shapes:")[1].split(".")[0]
    assert sorted(s.strip() for s in listed.split(",")) == shapes.names()
    assert "[default: (dgx-h100:4)]" in line


def test_dir_help_names_the_default_directory() -> None:
    out = CliRunner().invoke(app, ["sim", "fault", "--help"], env={"COLUMNS": "400"}).output
    line = next(ln for ln in out.splitlines() if "--dir" in ln)
    assert "default: ~/.cache/gpu-operator/sim/current" in line
