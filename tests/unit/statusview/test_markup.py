"""Text from the cluster reaches the terminal as text: rich would read `[state-driver ...]` in a
policy message as a markup tag and drop it (the status view and the demo's last line)."""

from __future__ import annotations

from rich.console import Console

from gpu_operator.statusview.render import render_view
from gpu_operator.statusview.table import build_view
from tests.unit.statusview.test_table import node, policy

MESSAGE = "ClusterPolicy is not ready, states not ready: [state-driver state-container-toolkit]"


def test_a_policy_message_with_brackets_is_shown_whole() -> None:
    view = build_view(
        [node("gpu-a")],
        [],
        [],
        [policy(state="notReady", reason="OperandNotReady", message=MESSAGE)],
        "gpu-operator",
    )
    console = Console(record=True, width=200)
    console.print(render_view(view))
    text = console.export_text()
    assert f"(OperandNotReady: {MESSAGE})" in text, text


def test_the_demos_not_ready_line_keeps_the_brackets() -> None:
    from gpu_operator.sim.commands.demo import not_ready_text

    view = build_view(
        [node("gpu-a")],
        [],
        [],
        [policy(state="notReady", reason="OperandNotReady", message=MESSAGE)],
        "gpu-operator",
    )
    console = Console(record=True, width=300)
    console.print(not_ready_text(view, 240))
    text = console.export_text()
    assert text.startswith("not ready after 240s: ClusterPolicy cluster-policy: notReady (OperandNotReady: ")
    assert "[state-driver state-container-toolkit]" in text, text
