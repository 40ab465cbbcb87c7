"""The monitoring part of the ClusterPolicy's spec: a ServiceMonitor's settings (scrape interval,
labels, relabeling rules) as the Prometheus operator's monitoring API accepts them, used by
spec.operator.metrics and spec.dcgmExporter; re-exported by gpu_operator.api.clusterpolicy."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpu_operator.api.checks import Labels
from gpu_operator.api.common import Model

# Prometheus durations as the monitoring API (and upstream's CRD) accept them: 30s, 1m30s, 0.
PrometheusDuration = Annotated[
    str,
    Field(
        pattern=r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
        description="Interval at which metrics are scraped; units y, w, d, h, m, s, ms (e.g. 30s, 1m30s).",
    ),
]
RelabelAction = Literal[
    "replace",
    "Replace",
    "keep",
    "Keep",
    "drop",
    "Drop",
    "hashmod",
    "HashMod",
    "labelmap",
    "LabelMap",
    "labeldrop",
    "LabelDrop",
    "labelkeep",
    "LabelKeep",
    "lowercase",
    "Lowercase",
    "uppercase",
    "Uppercase",
    "keepequal",
    "KeepEqual",
    "dropequal",
    "DropEqual",
]


class RelabelConfig(Model):
    """One relabeling rule of a ServiceMonitor endpoint (the monitoring API's RelabelConfig)."""

    action: RelabelAction | None = Field(
        default=None, description="What to do when regex matches (default replace)."
    )
    modulus: int | None = Field(default=None, ge=0)
    regex: str | None = None
    replacement: str | None = None
    separator: str | None = None
    sourceLabels: list[str] | None = None
    targetLabel: str | None = None


class ServiceMonitorConfig(Model):
    enabled: bool | None = None
    interval: PrometheusDuration | None = None
    scrapeTimeout: str | None = None
    honorLabels: bool | None = None
    additionalLabels: Labels | None = None
    relabelings: list[RelabelConfig] | None = None


class OperatorMetricsSpec(Model):
    serviceMonitor: ServiceMonitorConfig | None = None
