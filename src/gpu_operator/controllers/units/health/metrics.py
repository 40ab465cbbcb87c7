"""The GPU health metrics (docs/health.md, docs/operator.md); the alert rules use these names."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

NODE_HEALTH = Gauge(
    "gpu_operator_node_gpu_health",
    "GPU health per node: 1 for the node's current state (healthy, warning, quarantined, "
    "remediating, failed, held), 0 for the others",
    ["node", "state"],
)
REMEDIATIONS = Counter(
    "gpu_operator_health_remediations",
    "Finished remediation attempts per node, by result (succeeded, failed)",
    ["node", "result"],
)
