"""What the driver upgrade state machine (state.py) reads: the owner's upgradePolicy flattened
(Policy, every default the api model's), one node's facts (UpgradeNodeFacts) and its driver pod's
(DriverPod), and the driver DaemonSet's newest ControllerRevision's hash. Pure; state.py re-exports
every name."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.common import DrainSpec, DriverUpgradePolicySpec, PodDeletionSpec, WaitForCompletionSpec
from gpu_operator.controllers.drain import PodFacts
from gpu_operator.vocabulary import CONTROLLER_REVISION_HASH, UNKNOWN, UPGRADE_SKIP, UPGRADE_STATE

VALIDATION_TIMEOUT_SECONDS = 600  # upstream's fixed validation timeout

# The api model's defaults, read once.
_API, _WAIT, _DELETION, _DRAIN = (
    DriverUpgradePolicySpec(),
    WaitForCompletionSpec(),
    PodDeletionSpec(),
    DrainSpec(),
)


@dataclass(frozen=True)
class Policy:
    """driver.upgradePolicy, flattened; every default is the api model's (api/common.py)."""

    auto_upgrade: bool = _API.autoUpgrade
    max_parallel: int = _API.maxParallelUpgrades
    max_unavailable: int | str = _API.maxUnavailable
    wait_selector: str = _WAIT.podSelector or ""
    wait_timeout: int = _WAIT.timeoutSeconds
    deletion_force: bool = _DELETION.force
    deletion_timeout: int = _DELETION.timeoutSeconds
    deletion_empty_dir: bool = _DELETION.deleteEmptyDir
    drain_enable: bool = _DRAIN.enable
    drain_force: bool = _DRAIN.force
    drain_selector: str = _DRAIN.podSelector or ""
    drain_timeout: int = _DRAIN.timeoutSeconds
    drain_empty_dir: bool = _DRAIN.deleteEmptyDir
    validation_timeout: int = VALIDATION_TIMEOUT_SECONDS

    @classmethod
    def of(cls, spec: DriverUpgradePolicySpec | None) -> Policy:
        """From a validated upgradePolicy (ClusterPolicy `driver.upgradePolicy` or NVIDIADriver
        `upgradePolicy`: the api model holds the defaults); None -> auto-upgrade off."""
        if spec is None:
            return cls()
        wait, deletion, drain = (
            spec.waitForCompletion or _WAIT,
            spec.podDeletion or _DELETION,
            spec.drain or _DRAIN,
        )
        return cls(
            auto_upgrade=spec.autoUpgrade,
            max_parallel=spec.maxParallelUpgrades,
            max_unavailable=spec.maxUnavailable,
            wait_selector=wait.podSelector or "",
            wait_timeout=wait.timeoutSeconds,
            deletion_force=deletion.force,
            deletion_timeout=deletion.timeoutSeconds,
            deletion_empty_dir=deletion.deleteEmptyDir,
            drain_enable=drain.enable,
            drain_force=drain.force,
            drain_selector=drain.podSelector or "",
            drain_timeout=drain.timeoutSeconds,
            drain_empty_dir=drain.deleteEmptyDir,
        )

    def unavailable_limit(self, total: int) -> int:
        """maxUnavailable as a node count: an int, or a percent of the managed nodes rounded up."""
        value = self.max_unavailable
        if isinstance(value, str):
            text = value.strip()
            if text.endswith("%"):
                return math.ceil(total * float(text[:-1]) / 100)
            return int(text)
        return int(value)


@dataclass(frozen=True)
class DriverPod:
    name: str
    namespace: str
    in_sync: bool  # controller-revision-hash == the DaemonSet's latest ControllerRevision
    orphaned: bool = False  # no DaemonSet owns it
    ready: bool = False  # Running and every container ready
    restarts: int = 0  # the highest container restartCount
    restart_only: bool = False  # same DRIVER_CONFIG_DIGEST as the DaemonSet template
    terminating: bool = False


@dataclass(frozen=True)
class UpgradeNodeFacts:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)  # state and skip labels are read
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    driver: DriverPod | None = None
    pods: Sequence[PodFacts] = ()
    validators_ready: bool | None = None  # None: no validator pod on the node

    @property
    def state(self) -> str:
        return self.labels.get(UPGRADE_STATE, UNKNOWN)

    @property
    def skip(self) -> bool:
        return self.labels.get(UPGRADE_SKIP) == "true"

    def ts(self, key: str) -> float | None:
        try:
            return float(self.annotations[key])
        except (KeyError, ValueError):
            return None


def latest_revision_hash(revisions: Iterable[Mapping[str, Any]]) -> str | None:
    """The DaemonSet's newest ControllerRevision's hash (highest `.revision`)."""
    best: Mapping[str, Any] | None = None
    for rev in revisions:
        if best is None or int(rev.get("revision", 0)) > int(best.get("revision", 0)):
            best = rev
    if best is None:
        return None
    labels = (best.get("metadata") or {}).get("labels") or {}
    return labels.get(CONTROLLER_REVISION_HASH)
