"""Driver upgrade state per node, read from the labels and annotations the upgrade controller
writes: for `gpu-operator status` (a column and problems) and `gpu-operator upgrade status`."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gpu_operator.vocabulary import (
    UPGRADE_FAILED,
    UPGRADE_FAILURE_REASON_ANNOTATION,
    UPGRADE_PAUSED_ANNOTATION,
    UPGRADE_SKIP,
    UPGRADE_STATE,
    UPGRADE_STATE_SINCE_ANNOTATION,
)

FAILED = UPGRADE_FAILED


@dataclass(frozen=True)
class NodeUpgrade:
    node: str
    state: str
    since: float | None  # seconds in this state, when known
    reason: str = ""
    skip: bool = False

    @property
    def text(self) -> str:
        """Short cell text: state, time in state, skip."""
        if not self.state:
            return ""
        out = self.state.removeprefix("upgrade-") if self.state.startswith("upgrade-") else self.state
        if self.since is not None:
            out += f" {duration(self.since)}"
        return out + (" (skip)" if self.skip else "")


def duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def node_upgrade(node: dict[str, Any], now: float | None = None) -> NodeUpgrade:
    meta = node.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    since = None
    with contextlib.suppress(KeyError, ValueError):
        since = (now or time.time()) - float(notes[UPGRADE_STATE_SINCE_ANNOTATION])
    return NodeUpgrade(
        meta.get("name", ""),
        labels.get(UPGRADE_STATE, ""),
        since,
        notes.get(UPGRADE_FAILURE_REASON_ANNOTATION, "") if labels.get(UPGRADE_STATE) == FAILED else "",
        labels.get(UPGRADE_SKIP) == "true",
    )


def paused(policy: dict[str, Any] | None) -> bool:
    notes = ((policy or {}).get("metadata") or {}).get("annotations") or {}
    return bool(notes.get(UPGRADE_PAUSED_ANNOTATION) == "true")


def summary(upgrades: list[NodeUpgrade]) -> str:
    counts = Counter(u.state for u in upgrades if u.state)
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no node has an upgrade state"


def problems(upgrades: list[NodeUpgrade]) -> list[str]:
    return [
        f"driver upgrade failed on {u.node}: {u.reason or 'no reason recorded'} "
        f"(after fixing: gpu-operator upgrade retry {u.node})"
        for u in upgrades
        if u.state == FAILED
    ]
