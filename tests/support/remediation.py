"""The health remediation tests' witnesses (tests/integration/test_health_remediation.py): one Node
as they read it (`Seen`: the health and upgrade state labels, the GPU condition, taints, cordon,
annotations and the agent's report) and every change of a node's health and upgrade states in
order (`Recorder`, a Node watch of their own)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpu_operator.api.health import HealthReport
from gpu_operator.vocabulary import (
    HEALTH_CONDITION,
    HEALTH_REPORT_ANNOTATION,
    HEALTH_STATE,
    HEALTH_TAINT,
    UPGRADE_STATE,
)


@dataclass(frozen=True)
class Seen:
    """One Node as the tests read it."""

    state: str  # HEALTH_STATE label ('' none)
    upgrade: str  # the driver upgrade's state label
    condition: tuple[str, str] | None  # NvidiaGPUReady (status, reason)
    taints: tuple[str, ...]
    cordoned: bool
    notes: dict[str, str]
    report: HealthReport | None

    @classmethod
    def of(cls, node: Node) -> Seen:
        meta, spec, status = node.metadata, node.spec, node.status
        labels = (meta.labels if meta else None) or {}
        notes = dict((meta.annotations if meta else None) or {})
        cond = next(
            (
                (c.status, c.reason or "")
                for c in (status.conditions if status else None) or []
                if c.type == HEALTH_CONDITION
            ),
            None,
        )
        text = notes.get(HEALTH_REPORT_ANNOTATION)
        return cls(
            labels.get(HEALTH_STATE, ""),
            labels.get(UPGRADE_STATE, ""),
            cond,
            tuple(t.key for t in (spec.taints if spec else None) or []),
            bool(spec and spec.unschedulable),
            notes,
            HealthReport.parse(text) if text is not None else None,
        )

    @property
    def released(self) -> bool:
        return (
            self.state == ""
            and self.condition == ("True", "GPUsHealthy")
            and HEALTH_TAINT not in self.taints
            and not self.cordoned
        )


class Recorder:
    """Watches Nodes and records each change of (health state, upgrade state) per node, in order:
    the tests' own witness of what the operator did between two looks."""

    def __init__(self, kube: Client, names: list[str]) -> None:
        self.kube, self.names = kube, set(names)
        self.now: dict[str, tuple[str, str]] = {}
        self.timeline: list[tuple[str, str, str]] = []  # (node, health state, upgrade state)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for _, node in self.kube.watch(Node, server_timeout=5):
                    name = str(node.metadata.name) if node.metadata else ""
                    if name in self.names:
                        labels = (node.metadata.labels if node.metadata else None) or {}
                        pair = (labels.get(HEALTH_STATE, ""), labels.get(UPGRADE_STATE, ""))
                        if self.now.get(name) != pair:
                            self.now[name] = pair
                            self.timeline.append((name, *pair))
                    if self.stop.is_set():
                        return
            except Exception:  # noqa: BLE001 - the watch restarts; the next list catches up
                time.sleep(0.2)

    def states(self, node: str) -> list[str]:
        """The node's health states in order, repeats folded."""
        out: list[str] = []
        for name, state, _ in self.timeline:
            if name == node and (not out or out[-1] != state):
                out.append(state)
        return out

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
