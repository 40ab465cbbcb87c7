"""Every container the renderer gives a `gpu-operator ...` command runs a command the CLI has, with
options that command takes (a rendered DaemonSet that names a missing subcommand crash-loops)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from gpu_operator.cli import app
from tests.unit.render import renderkit

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("clusterpolicy-*.yaml"))


def our_commands(spec: dict[str, Any], shape: str) -> list[list[str]]:
    result = renderkit.run(spec, shape)
    out = []
    for state in result.states:
        for manifest in state.objects:
            pod = (manifest.get("spec", {}).get("template") or {}).get("spec") or {}
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                argv = [*c.get("command", []), *c.get("args", [])]
                if argv[:1] == ["gpu-operator"]:
                    out.append(argv[1:])
    return out


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")


def resolve(argv: list[str]) -> tuple[Any, list[str]]:
    """The deepest command `argv` names and the words left for it."""
    command: Any = typer.main.get_command(app)
    rest = list(argv)
    while is_group(command) and rest and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    return command, rest


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_gpu_operator_commands_exist(example: Path) -> None:
    spec = yaml.safe_load(example.read_text())["spec"]
    for shape in ("vfio-passthrough:1", "dgx-h100:1"):
        for argv in our_commands(spec, shape):
            command, rest = resolve(argv)
            assert not is_group(command), f"`gpu-operator {' '.join(argv)}`: no such command"
            known = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
            unknown = [
                a.split("=", 1)[0] for a in rest if a.startswith("-") and a.split("=", 1)[0] not in known
            ]
            assert unknown == [], f"`gpu-operator {' '.join(argv)}`: {command.name} takes no {unknown}"


def test_resolve_tells_a_missing_subcommand() -> None:
    assert is_group(resolve(["node", "vfio-manager", "reconcile"])[0])
    command, rest = resolve(["vfio-manage", "reconcile", "--once"])
    assert command.name == "reconcile" and rest == ["--once"]


def test_the_examples_render_commands_of_ours_to_check() -> None:
    """The check above loops over what the examples render; it must have something to check."""
    rendered = [
        argv
        for example in EXAMPLES
        for shape in ("vfio-passthrough:1", "dgx-h100:1")
        for argv in our_commands(yaml.safe_load(example.read_text())["spec"], shape)
    ]
    assert len(rendered) >= 3, rendered
