"""What rendering returns: per-state objects to apply, what the operator must not delete, and the errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]


class RenderError(ValueError):
    """A policy that loads but cannot be rendered; names the field and how to fix it."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path
        self.message = message


@dataclass(frozen=True, order=True)
class ObjectRef:
    """Enough to delete an object: apiVersion, kind, name and namespace (None if cluster-scoped)."""

    apiVersion: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: Manifest) -> ObjectRef:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


@dataclass
class StateResult:
    """One state of the walk: whether it is enabled, why, and what to apply.

    The renderer lists no deletes: what the operator owns and no longer finds in any state's
    objects is deleted by the operator (see RenderResult.keep_kinds and orphan_pods)."""

    name: str
    enabled: bool
    reason: str
    objects: list[Manifest] = field(default_factory=list)
    # Delete this state's DaemonSets leaving their pods running (the driver handed over to
    # NVIDIADrivers: its pods stay until the new DaemonSets replace them).
    orphan_pods: bool = False


@dataclass
class RenderResult:
    """Every state in upstream order (all 20), plus warnings about the policy."""

    states: list[StateResult]
    warnings: list[str] = field(default_factory=list)
    # Kinds the operator leaves alone although no state renders them this time: DaemonSets
    # while no node has nvidia.com/gpu.present=true (upstream keeps them until GPU nodes come).
    keep_kinds: frozenset[str] = frozenset()

    def state(self, name: str) -> StateResult:
        for state in self.states:
            if state.name == name:
                return state
        raise KeyError(name)

    def objects(self) -> list[Manifest]:
        """Every object to apply, in apply order."""
        return [obj for state in self.states for obj in state.objects]
