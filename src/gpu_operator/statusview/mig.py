"""Each node's MIG config and state, read from the Node: `nvidia.com/mig.config` (what is asked),
`nvidia.com/mig.config.state` (what NVIDIA's MIG manager says) and the operator's NvidiaMIGReady
condition (why a change is stuck, failed or invalid): for `gpu-operator status` (a column and
problems)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpu_operator.vocabulary import (
    MIG_CONDITION,
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    MIG_FAILED,
    MIG_INVALID_CONFIG,
    MIG_MANAGER_GONE,
    MIG_STUCK,
)

# The condition's reasons that need a person (or say why the operator is retrying).
TROUBLE = (MIG_STUCK, MIG_MANAGER_GONE, MIG_FAILED, MIG_INVALID_CONFIG)


@dataclass(frozen=True)
class NodeMIG:
    node: str
    config: str = ""  # nvidia.com/mig.config ('' none)
    state: str = ""  # nvidia.com/mig.config.state ('' not yet written)
    reason: str = ""  # NvidiaMIGReady's reason ('' no condition yet)
    message: str = ""

    @property
    def text(self) -> str:
        """Short cell text: the config and its state, and the reason where the operator found trouble."""
        if not self.config and not self.state:
            return ""
        out = f"{self.config or '?'}: {self.state or 'not started'}"
        return out + (f" ({self.reason})" if self.reason in TROUBLE else "")


def node_mig(node: dict[str, Any]) -> NodeMIG:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    cond: dict[str, Any] = next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == MIG_CONDITION), {}
    )
    return NodeMIG(
        meta.get("name", ""),
        labels.get(MIG_CONFIG, ""),
        labels.get(MIG_CONFIG_STATE, ""),
        cond.get("reason", ""),
        cond.get("message", ""),
    )


def problems(rows: Iterable[NodeMIG]) -> list[str]:
    """One line per node whose MIG change is stuck, failed or asks for a config that does not exist."""
    return [f"MIG: node {row.node} {row.reason}: {row.message}" for row in rows if row.reason in TROUBLE]
