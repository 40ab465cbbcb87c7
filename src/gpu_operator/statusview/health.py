"""GPU health per node, read from what the operator writes on the Node (the NvidiaGPUReady
condition, the nvidia.com/gpu-health.state label and its annotations, the quarantine taint): for
`gpu-operator status` (a column and problems) and `gpu-operator health status`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpu_operator.statusview.upgrades import duration
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_CONDITION,
    HEALTH_REASON_ANNOTATION,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
    HEALTH_TAINT,
)

HELD_STATES = ("failed", "held")


@dataclass(frozen=True)
class NodeHealth:
    node: str
    ready: str = ""  # the condition's status: True | False | Unknown | '' (none yet)
    reason: str = ""  # the condition's reason (GPUsHealthy, GPUUnhealthy, ValidationPending ...)
    message: str = ""
    remediation: str = ""  # HEALTH_STATE: quarantined, draining, acting, validating, failed, held
    since: float | None = None  # seconds in the remediation state
    attempts: int = 0
    why: str = ""  # why remediation failed or holds the node
    tainted: bool = False

    @property
    def text(self) -> str:
        """Short cell text: the remediation state and its time, else the condition's reason."""
        if self.remediation:
            out = self.remediation + (f" {duration(self.since)}" if self.since is not None else "")
            return out + (" (tainted)" if self.tainted and self.remediation not in HELD_STATES else "")
        if not self.ready:
            return ""
        return "ready" if self.ready == "True" else self.reason + (" (tainted)" if self.tainted else "")


def node_health(node: dict[str, Any], now: float | None = None) -> NodeHealth:
    meta = node.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    cond: dict[str, Any] = next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == HEALTH_CONDITION),
        {},
    )
    since = None
    with contextlib.suppress(KeyError, ValueError):
        since = (now or time.time()) - float(notes[HEALTH_SINCE_ANNOTATION])
    attempts = 0
    with contextlib.suppress(KeyError, ValueError):
        attempts = int(notes[HEALTH_ATTEMPTS_ANNOTATION])
    return NodeHealth(
        meta.get("name", ""),
        cond.get("status", ""),
        cond.get("reason", ""),
        cond.get("message", ""),
        labels.get(HEALTH_STATE, ""),
        since if labels.get(HEALTH_STATE) else None,
        attempts,
        notes.get(HEALTH_REASON_ANNOTATION, ""),
        any(t.get("key") == HEALTH_TAINT for t in (node.get("spec") or {}).get("taints") or []),
    )


def problems(rows: Iterable[NodeHealth]) -> list[str]:
    """One line per node remediation gave up on or holds, and per node quarantined."""
    out = []
    for row in rows:
        if row.remediation in HELD_STATES:
            out.append(
                f"GPU health: node {row.node} {row.remediation}: {row.why or row.message} "
                f"(gpu-operator health retry {row.node})"
            )
        elif row.tainted and not row.remediation:
            out.append(f"GPU health: node {row.node} quarantined ({row.reason}): {row.message}")
    return out
