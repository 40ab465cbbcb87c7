"""The health agent's report as the operator reads it: the JSON in the Node annotation
HEALTH_REPORT_ANNOTATION (nvidia.com/gpu-health.report), schema version 1.

    report = HealthReport.parse(node_annotations[HEALTH_REPORT_ANNOTATION])   # ReportError if garbage
    report.ready          # validated, not stopped, and no GPU unhealthy or gone
    report.action         # the strongest action a GPU needs (one of HEALTH_ACTIONS)

    NodeReport.of(text)   # the report, or why the text is none, or no report (text None): never raises

The GPU health unit (controllers/units/health/unit.py) reads each node's annotation once per pass into a
NodeReport, which the signals, the remediation machine and the DRA device taints share.

The agent (gpu_operator.node.health) writes it once per change and never while nothing changes.
Unknown keys are refused: a newer agent bumps `v`, and an older operator then says which version
it understands instead of guessing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from gpu_operator.vocabulary import HEALTH_REPORT_ANNOTATION

SCHEMA_VERSION = 1
GpuState = Literal["healthy", "warning", "unhealthy", "gone"]
Action = Literal["none", "restart-app", "reset-gpu", "reboot"]  # vocabulary.HEALTH_ACTIONS
STATES: tuple[str, ...] = ("healthy", "warning", "unhealthy", "gone")  # mildest first
BUS = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"


# What the agent did with a reset request, per GPU (node/health/requests.py)
ResetOutcome = Annotated[str, StringConstraints(pattern=r"^(done|refused:.+|failed:.+)$", max_length=200)]
Bus = Annotated[str, StringConstraints(pattern=BUS)]


class ReportError(ValueError):
    """The annotation's text is no health report; the message names the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class GpuHealth(_Strict):
    """One GPU that is not healthy."""

    bus: str = Field(pattern=BUS, description="PCI address as sysfs names it, e.g. 0000:41:00.0")
    state: Literal["warning", "unhealthy", "gone"]
    action: Action
    reason: str = Field(max_length=200)
    minor: int | None = Field(default=None, ge=0, description="the driver's device minor (/proc)")
    index: int | None = Field(default=None, ge=0, description="NVML's index")
    xid: int | None = Field(default=None, ge=0, description="the Xid that set the state, if any")
    recovery: str | None = Field(
        default=None,
        max_length=40,
        pattern=r"^[a-z0-9-]+$",
        description="the driver's recovery action as NVML offers it (drivers from 565)",
    )


class HealthReport(_Strict):
    v: Literal[1]
    validated: bool
    state: GpuState
    action: Action
    healthy: int = Field(ge=0)
    gpus: tuple[GpuHealth, ...] = Field(max_length=64)
    sources: tuple[Literal["kmsg", "nvml", "pci", "proc"], ...]
    missing: tuple[str, ...] = ()
    stopped: bool = False
    reset: dict[Bus, ResetOutcome] = Field(
        default_factory=dict, max_length=64, description="the last reset request's outcome per GPU"
    )
    reboot: str | None = Field(
        default=None,
        max_length=40,
        description="the reboot request the agent created the reboot sentinel for",
    )
    validatedAt: float | None = Field(
        default=None,
        ge=0,
        description="when the node's validation passed (epoch seconds: the newest "
        "expected validator status file's mtime); the operator releases a "
        "remediated node only on a validation newer than its action",
    )
    answered: str | None = Field(
        default=None,
        max_length=80,
        description="the operator's last request the agent carried out in full (its id: "
        "action:attempt:since, node/health/requests.py)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> HealthReport:
        worst = max((g.state for g in self.gpus), key=STATES.index, default="healthy")
        if self.state != worst:
            raise ValueError(f"state {self.state!r} is not the worst GPU state ({worst!r}) of gpus")
        if self.validated and self.missing:
            raise ValueError("validated is true but missing lists validations: one of them is wrong")
        return self

    @property
    def ready(self) -> bool:
        """What the node condition says: validated, the agent running, no GPU unhealthy or gone."""
        return self.validated and not self.stopped and all(g.state == "warning" for g in self.gpus)

    @property
    def unhealthy(self) -> tuple[GpuHealth, ...]:
        return tuple(g for g in self.gpus if g.state in ("unhealthy", "gone"))

    def reset_outcome(self, bus: str) -> tuple[str, str] | None:
        """(`done` | `refused` | `failed`, why) of the last reset request for one GPU; None: none."""
        value = self.reset.get(bus)
        if value is None:
            return None
        kind, _, why = value.partition(":")
        return kind, why

    @classmethod
    def parse(cls, text: str) -> HealthReport:
        """The report in an annotation's text; ReportError (naming the field) for anything else."""
        where = f"annotation {HEALTH_REPORT_ANNOTATION}"
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as err:
            raise ReportError(f"{where}: not JSON ({err}); the health agent writes a JSON object") from None
        if not isinstance(data, dict):
            raise ReportError(f"{where}: a JSON {type(data).__name__}, not an object")
        if data.get("v") != SCHEMA_VERSION:
            raise ReportError(
                f"{where}: schema version v={data.get('v')!r}; this operator reads v={SCHEMA_VERSION} "
                "(upgrade the operator or run the matching agent image)"
            )
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(report)"
            raise ReportError(
                f"{where}: field {field}: {first['msg']} "
                f"({err.error_count()} problem(s); the agent's report format is v{SCHEMA_VERSION})"
            ) from None


@dataclass(frozen=True)
class NodeReport:
    """A node's report annotation as read once: `report` when the text is one, `error` (the
    ReportError's message) when it is not; both None when the node carries no report."""

    report: HealthReport | None = None
    error: str | None = None

    @classmethod
    def of(cls, text: str | None) -> NodeReport:
        if text is None:
            return cls()
        try:
            return cls(HealthReport.parse(text))
        except ReportError as err:
            return cls(error=str(err))
