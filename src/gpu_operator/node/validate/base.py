"""What every validation shares: its context, the status directory, and bounded waits that end with a reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runner import CommandRunner
from gpu_operator.node.validate.config import ValidatorConfig


class ValidationFailed(Exception):
    """A check failed or a wait ran out; the message says what, where, how long and the likely fix."""


class Outcome(StrEnum):
    PASSED = "passed"
    SKIPPED = "skipped"
    NOT_APPLICABLE = "not-applicable"
    FAILED = "failed"


@dataclass
class ValidationResult:
    component: str
    outcome: Outcome
    message: str = ""
    files: list[str] = field(default_factory=list)


@dataclass
class PodOutcome:
    """How a validation workload pod ended."""

    succeeded: bool
    phase: str
    detail: str = ""


class ValidatorNodeView(Protocol):
    """What validations need from the Kubernetes API about their own node (see node/cluster/kubeapi.py)."""

    def node_labels(self) -> dict[str, str]: ...

    def node_annotations(self) -> dict[str, str]: ...

    def node_allocatable(self) -> dict[str, str]: ...

    def run_pod(self, manifest: dict[str, Any], timeout: float) -> PodOutcome: ...

    def validator_pod_template(self) -> dict[str, Any]: ...


class StatusDir:
    """The status files of one node (<host-root>/<OUTPUT_DIR>)."""

    def __init__(self, fs: HostFS, output_dir: str) -> None:
        self.fs = fs
        self.dir = output_dir.rstrip("/") or "/"

    def path(self, name: str) -> str:
        return f"{self.dir}/{name}"

    def exists(self, name: str) -> bool:
        return self.fs.exists(self.path(name))

    def remove(self, name: str) -> None:
        self.fs.remove(self.path(name))

    def write(self, name: str, values: Mapping[str, str] | str = "") -> str:
        text = values if isinstance(values, str) else "".join(f"{k}={v}\n" for k, v in values.items())
        self.fs.write_atomic(self.path(name), text)
        return self.path(name)

    def read_flags(self, name: str) -> dict[str, str]:
        """`KEY=value` or `KEY: value` lines (the driver container writes either)."""
        out: dict[str, str] = {}
        for line in (self.fs.read_text(self.path(name)) or "").splitlines():
            sep = "=" if "=" in line else ":"
            key, found, value = line.partition(sep)
            if found and key.strip() and not key.lstrip().startswith("#"):
                out[key.strip()] = value.strip().strip('"')
        return out


@dataclass
class Context:
    fs: HostFS
    runner: CommandRunner
    config: ValidatorConfig
    kube: ValidatorNodeView | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    log: Callable[[str], None] = lambda _msg: None

    @property
    def status(self) -> StatusDir:
        return StatusDir(self.fs, self.config.output_dir)

    def wait(
        self,
        check: Callable[[], str | None],
        *,
        component: str,
        what: str,
        where: str,
        fix: str,
        always: bool = False,
    ) -> None:
        """Poll `check` (None = satisfied, else the current reason) within the component's budget.

        Without WITH_WAIT a check gets one try, as upstream's validator does, unless `always`
        (things that take time by nature: a pod we started, a resource the plugin registers).
        """
        budget = self.config.budgets.get(component, 300.0)
        started = self.clock()
        while True:
            reason = check()
            if reason is None:
                return
            elapsed = self.clock() - started
            if not (self.config.with_wait or always) or elapsed >= budget:
                waited = (
                    f"waited {elapsed:.0f}s of {budget:.0f}s"
                    if (self.config.with_wait or always)
                    else "checked once (WITH_WAIT=false)"
                )
                raise ValidationFailed(
                    f"{component}: {what} at {where}: {waited}; last: {reason}. Likely fix: {fix}"
                )
            self.log(f"{component}: waiting for {what} ({reason})")
            self.sleep(
                min(self.config.sleep_interval, max(budget - elapsed, 0.0)) or self.config.sleep_interval
            )
