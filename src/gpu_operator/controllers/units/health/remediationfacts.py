"""What the remediation machine (machine.py) keeps and reads of a node: its memory on the Node (the
HEALTH_STATE values and the nvidia.com/gpu-health.* annotation keys), the GPU clients it pauses for
a reset, one node's facts (RemediationFacts, node_facts) and the node's entry in the requests Secret
(request_text, request_id). Pure, like the machine; machine.py re-exports every name."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_operator.api.health import HealthReport
from gpu_operator.controllers import drain as node_drain
from gpu_operator.controllers.views import HEALTH_ANNOTATION_PREFIX, NodeView
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_REASON_ANNOTATION,
    HEALTH_REPORT_ANNOTATION,
    HEALTH_REQUEST_ACTIONS,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
    deploy_label,
)

PREFIX = HEALTH_ANNOTATION_PREFIX
SINCE = HEALTH_SINCE_ANNOTATION  # when the current state began (epoch seconds)
ATTEMPTS = HEALTH_ATTEMPTS_ANNOTATION  # failed attempts so far
STEP = f"{PREFIX}step"  # index into the policy's actions of the action now or next
ACTION = f"{PREFIX}action"  # the action last carried out
REASON = HEALTH_REASON_ANNOTATION  # why the node failed or is held
UNHEALTHY_AT = f"{PREFIX}unhealthy-at"  # when it turned unhealthy, comma-separated (flapping window)
INITIALLY_UNSCHEDULABLE = f"{PREFIX}initially-unschedulable"  # cordoned before we began: left cordoned
DRAIN_START = f"{PREFIX}drain-start"
# The request of this attempt the agent answered (its `since`): then withdrawn, and the node may be
# released. Requests themselves are entries in the operator's requests Secret (request_text), which
# only the operator writes; the agent answers in its report (`answered`), node/health/requests.py.
ANSWERED = f"{PREFIX}answered"
# When the action was carried out and the node's validation restarted (epoch seconds, ms): only a
# validation that passed after it (the report's validatedAt) releases the node.
REVALIDATED = f"{PREFIX}revalidated"
VALIDATOR_RESTART = (
    "revalidate"  # Step.action: delete the validator pod on the node (its DaemonSet starts a new one)
)
REQUESTED = HEALTH_REQUEST_ACTIONS  # the actions the node agent carries out on request

# Before a GPU reset the operator pauses the node's GPU clients, DaemonSet pods that hold the
# GPUs' device files all the time and that no drain evicts, as NVIDIA's driver upgrade and MIG
# manager do: their deploy labels at a paused value (the label's owner, node labelling, never
# overwrites a non-empty value), only those at `true` (a value another owner set is left alone),
# remembered in PAUSED and put back to `true` when the reset is answered or the attempt ends.
PAUSED_VALUE = "paused-for-gpu-reset"
PAUSED = f"{PREFIX}paused"
GPU_CLIENTS = tuple(
    deploy_label(c)
    for c in ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery", "mig-manager")
)
# their pods' app labels (the MIG manager's clients, vocabulary.MIG_CLIENT_APPS, and itself)
GPU_CLIENT_APPS = (
    "nvidia-device-plugin-daemonset",
    "nvidia-dcgm",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
)

QUARANTINED, DRAINING, ACTING, VALIDATING, FAILED, HELD = (
    "quarantined",
    "draining",
    "acting",
    "validating",
    "failed",
    "held",
)
ACTIVE = (DRAINING, ACTING, VALIDATING)  # what maxUnavailable bounds, and what a driver upgrade waits for
CLEAR_REQUESTS: dict[str, str | None] = {ANSWERED: None, REVALIDATED: None, DRAIN_START: None, PAUSED: None}


def resumed(node: RemediationFacts) -> dict[str, str | None]:
    """The GPU clients we paused back to `true` (a label someone changed since is left alone)."""
    keys = [k for k in node.annotations.get(PAUSED, "").split(",") if k in GPU_CLIENTS]
    return {k: "true" for k in keys if node.labels.get(k) == PAUSED_VALUE}


@dataclass(frozen=True)
class RemediationFacts:
    """What the machine reads of one node."""

    name: str
    state: str = ""  # HEALTH_STATE label ('' none)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    report: HealthReport | None = (
        None  # None: no report, or one that cannot be read (api/health.py NodeReport)
    )
    pods: Sequence[node_drain.PodFacts] = ()  # read only while draining
    clients: Sequence[str] = ()  # GPU client pods still on the node (read only while they are paused)

    @property
    def broken(self) -> bool:
        """A GPU unhealthy or gone: what quarantines a node."""
        return self.report is not None and bool(self.report.unhealthy)

    @property
    def recovered(self) -> bool:
        """Validated, the agent running, no GPU unhealthy or gone."""
        r = self.report
        return r is not None and r.validated and not r.stopped and not r.unhealthy

    @property
    def fresh(self) -> bool:
        """The report's validation passed after the action was carried out (REVALIDATED)."""
        mark = self.annotations.get(REVALIDATED)
        try:
            after = float(mark) if mark is not None else None
        except ValueError:
            after = None
        return (
            after is not None
            and self.report is not None
            and self.report.validatedAt is not None
            and self.report.validatedAt > after
        )

    @property
    def pending(self) -> bool:
        """In validating after an action the agent carries out, whose request it has not answered."""
        return self.annotations.get(ACTION) in REQUESTED and self.annotations.get(
            ANSWERED
        ) != self.annotations.get(SINCE)

    def number(self, key: str) -> int:
        try:
            return int(float(self.annotations.get(key, "")))
        except ValueError:
            return 0


def node_facts(
    view: NodeView,
    report: HealthReport | None,
    pods: Sequence[node_drain.PodFacts] = (),
    clients: Sequence[str] = (),
) -> RemediationFacts:
    """`report`: the node's report as the unit parsed it this pass (None: none, or unreadable)."""
    # the machine's own memory: our prefix, but not the agent's report (which shares it)
    notes = {
        k: v for k, v in view.annotations.items() if k.startswith(PREFIX) and k != HEALTH_REPORT_ANNOTATION
    }
    return RemediationFacts(
        view.name,
        view.labels.get(HEALTH_STATE, ""),
        notes,
        view.selectable,
        view.unschedulable,
        report,
        pods,
        clients,
    )


def request_text(node: str, action: str, gpus: Sequence[str], attempt: int, since: str) -> str:
    """A node's entry in the requests Secret (the keys vocabulary.py lists): `remediation` is the
    policy's switch (the machine runs only while it is on), `attempt` and `since` the remediation
    attempt it belongs to, as the Node's annotations say while it is validating."""
    return json.dumps(
        {
            "v": 1,
            "node": node,
            "action": action,
            "gpus": list(gpus),
            "remediation": True,
            "attempt": attempt,
            "since": since,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def request_id(node: RemediationFacts) -> str:
    """What the agent's report names in `answered` once it carried out this attempt's request."""
    return f"{node.annotations.get(ACTION, '')}:{node.number(ATTEMPTS)}:{node.annotations.get(SINCE, '')}"
