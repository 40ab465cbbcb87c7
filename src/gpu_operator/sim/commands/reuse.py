"""`sim up` and `sim demo` reuse a simulator already running in their directory. Its nodes were
made when it started: options that would need other nodes (`--shape`, `--real-node`) or another
stand-in (`--nfd`) are refused with what runs and the ways out, never silently ignored.

Refused, not honoured by adding the nodes: `--shape` names the whole fleet, not nodes to add
(`--shape cpu:2` on a running `dgx-h100:4` would have to remove four nodes, which pods and the
operator's state sit on), nodes added to someone's simulator would outlive the demo that added
them, and a real node needs root and its own start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator import shapes as shapes_mod
from gpu_operator.sim.commands.state import SimState

WAYS_OUT = (
    "Leave those options out to use it as it is, stop it first (gpu-operator sim down), or "
    "choose another --dir."
)


def _key(spec: str) -> tuple[str, int, tuple[tuple[str, str], ...]]:
    shape, count = shapes_mod.parse_spec(spec)
    return shape.name, count, tuple(sorted(shape.extra_labels.items()))


def same_fleet(running: list[str], asked: list[str]) -> bool:
    """The same nodes: the same shapes, counts and extra labels, in the same order (the order
    numbers the nodes)."""
    return [_key(s) for s in running] == [_key(s) for s in asked]


def conflicts(
    state: SimState, shapes: list[str] | None, real_node: str | None, nfd: bool = False
) -> list[str]:
    """What the running simulator `state` cannot give: `shapes` None means none was asked for."""
    out: list[str] = []
    if nfd and not state.nfd:
        out.append("--nfd: its stand-ins do not play NFD's master (it was started without --nfd)")
    if shapes is not None and not same_fleet(state.shapes, shapes):
        out.append(
            f"--shape {' --shape '.join(shapes)}: it runs the fake nodes "
            f"{' '.join(state.shapes) or '(none)'}, made when it started"
        )
    have: dict[str, Any] = state.real_node or {}
    if real_node and have.get("shape") != real_node:
        out.append(
            f"--real-node (shape {real_node}): "
            + (f"its real node has shape {have['shape']}" if have else "it was started without a real node")
        )
    return out


def refuse_unusable(
    directory: Path, shapes: list[str] | None, real_node: str | None, nfd: bool = False
) -> None:
    """SimError when a simulator runs in `directory` and cannot give what was asked; nothing when
    none runs (a new one is started with these options) or it can."""
    from gpu_operator.sim.commands import session

    for spec in shapes or []:  # a malformed spec is named first, before anything is looked up
        shapes_mod.parse_spec(spec)
    existing = session.running(directory)
    if existing is None:
        return
    problems = conflicts(existing, shapes, real_node, nfd)
    if problems:
        raise session.SimError(
            f"a simulator already runs in {directory}, and these options cannot apply to it: "
            f"{'; '.join(problems)}. {WAYS_OUT}"
        )
