"""The shape of one finding about a host (severity, evidence, fix), shared by every check module."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Finding(BaseModel):
    code: str = Field(description="stable kebab-case id, e.g. host-driver-on-passthrough")
    reason: str = Field(description="CamelCase form used as the Kubernetes event reason")
    severity: Severity
    summary: str
    evidence: list[str] = Field(default_factory=list)
    fix: str = ""


def finding(code: str, severity: Severity, summary: str, evidence: list[str], fix: str = "") -> Finding:
    reason = "".join(part.capitalize() for part in code.split("-"))
    return Finding(code=code, reason=reason, severity=severity, summary=summary, evidence=evidence, fix=fix)
