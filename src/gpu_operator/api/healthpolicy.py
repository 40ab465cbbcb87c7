"""ClusterPolicy `spec.health` (ours, not upstream's: an additive, optional field). How the operator
turns the health agent's per-node report into signals (a Node condition, a taint, Events,
metrics) and, opt-in, remediates a node whose GPUs failed. docs/health.md describes the behaviour,
docs/api.md lists the fields.

Where the schema can say it (enums, ranges, a CEL rule for maxUnavailable) the apiserver refuses a
bad value and names the field; the rest (label keys, a selector, the handoff label an `external`
action needs) is checked when the policy is loaded and reported in its status.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator
from pydantic.config import JsonDict

from gpu_operator.api.checks import IntOrPercent, LabelValue, Seconds, qualified_key
from gpu_operator.api.common import Model

# cluster-autoscaler (since 1.29, FAQ "How can I ... startup taints"): a taint whose key has this
# prefix marks a node that is not ready for pods yet; the autoscaler counts it as unready (and
# removes it after its provisioning budget, --max-node-provision-time) instead of as capacity.
CA_STARTUP_TAINT_PREFIX = "startup-taint.cluster-autoscaler.kubernetes.io/"
DEFAULT_STARTUP_TAINT = f"{CA_STARTUP_TAINT_PREFIX}nvidia-gpu-not-validated"
# The Node Readiness Controller (kubernetes-sigs/node-readiness-controller, API group
# readiness.node.x-k8s.io/v1alpha1): a NodeReadinessRule's taint key must have this prefix (its
# CRD's CEL rule), and cluster-autoscaler's --startup-taint-prefix (or --startup-taint KEY) makes
# the autoscaler count such a node as starting, as NVIDIA's cluster-autoscaler example does
# (NVIDIA/gpu-operator examples/cluster-autoscaler, pull request 2573).
READINESS_TAINT_PREFIX = "readiness.k8s.io/"
# The taint keys the operator may remove: those it reads from the Node view (controllers/views.py).
OUR_TAINT_PREFIXES = (CA_STARTUP_TAINT_PREFIX, READINESS_TAINT_PREFIX, "nvidia.com/")

# The escalation, mildest first. `external` hands the node to another controller (handoff label).
RemediationAction = Literal["restart-device-plugin", "reset-gpu", "reload-driver", "reboot", "external"]
DEFAULT_ACTIONS: tuple[RemediationAction, ...] = (
    "restart-device-plugin",
    "reset-gpu",
    "reload-driver",
    "reboot",
)

# CEL on an int-or-string: an int >= 0 or 'N%' with N in 0..100 (the apiserver names the field).
_MAX_UNAVAILABLE_RULE: JsonDict = {
    "rule": "type(self) == int ? self >= 0 : (self.matches('^[0-9]+$') || "
    "(self.matches('^[0-9]+%$') && int(self.replace('%', '')) <= 100))",
    "message": "maxUnavailable must be a non-negative integer (nodes) or a percentage from 0% to 100% (e.g. 1, 10%)",
}


def _startup_key(key: str) -> str:
    qualified_key(key)
    if not key.startswith(OUR_TAINT_PREFIXES):
        raise ValueError(
            f"startup taint key {key!r} must start with {CA_STARTUP_TAINT_PREFIX} (the "
            f"cluster-autoscaler's startup-taint convention), {READINESS_TAINT_PREFIX} (the Node "
            "Readiness Controller's) or nvidia.com/, so that the operator only removes taints meant "
            f"for it (e.g. {DEFAULT_STARTUP_TAINT})"
        )
    return key


def _selector(value: str | None) -> str | None:
    """A label selector string, checked for what the apiserver would refuse outright."""
    if value is None:
        return value
    for term in filter(None, (t.strip() for t in value.split(","))):
        if term.startswith("!"):
            qualified_key(term[1:].strip())
            continue
        key = term
        for op in ("!=", "==", "=", " notin ", " in "):
            if op in term:
                key = term.split(op, 1)[0]
                break
        qualified_key(key.strip())
    return value


class StartupTaintSpec(Model):
    """A taint the node's provisioner puts on at registration (kubelet --register-with-taints, a
    Karpenter NodePool's startupTaints); the operator removes it once the node's validation passed
    (enabled), and every operand tolerates it (enabled, or a `key` other than the default: a Node
    Readiness Controller that removes it on NvidiaGPUReady=True needs the validation to run under
    it)."""

    enabled: bool = Field(default=False, description="Remove the startup taint `key` once validation passes.")
    key: Annotated[str, AfterValidator(_startup_key)] = Field(
        default=DEFAULT_STARTUP_TAINT,
        description=f"The startup taint's key; must start with {CA_STARTUP_TAINT_PREFIX}, "
        f"{READINESS_TAINT_PREFIX} or nvidia.com/. The operands tolerate it when enabled or not the default.",
    )


class HandoffSpec(Model):
    """The `external` action: the label the operator puts on the node for another system to act on."""

    label: Annotated[str, AfterValidator(qualified_key)] = Field(
        description="Label key set on the node when it is handed over (e.g. example.com/repair)."
    )
    value: LabelValue = Field(default="requested", description="The label's value.")


class FlappingSpec(Model):
    """A GPU that turns unhealthy `transitions` times within `windowSeconds` is held, not cycled."""

    transitions: int = Field(default=3, ge=1)
    windowSeconds: Seconds = 3600


class RemediationSpec(Model):
    """Opt-in remediation: quarantine -> drain -> escalating actions -> validate -> release."""

    enabled: bool = Field(default=False, description="Remediate unhealthy nodes (off: signals only).")
    maxUnavailable: IntOrPercent = Field(
        default=1,
        json_schema_extra={"x-kubernetes-validations": [_MAX_UNAVAILABLE_RULE]},
        description="At most this many GPU nodes (or percent of them) in remediation at a time.",
    )
    maxAttempts: int = Field(default=3, ge=1, le=20, description="Failed attempts before a node is held.")
    podSelector: Annotated[str | None, AfterValidator(_selector)] = Field(
        default=None,
        description="Label selector of the GPU pods drain may evict; pods it excludes are never "
        "evicted (unset: every pod requesting a GPU).",
    )
    drainTimeoutSeconds: Seconds = Field(default=300, description="How long a drain may take (0: no limit).")
    validationTimeoutSeconds: int = Field(
        default=600, ge=1, description="How long validation may take after an action."
    )
    actions: list[RemediationAction] = Field(
        default_factory=lambda: list(DEFAULT_ACTIONS),
        min_length=1,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="The escalation, in order: restart-device-plugin, reset-gpu, reload-driver, reboot, external.",
    )
    externalHandoff: HandoffSpec | None = None
    flapping: FlappingSpec = Field(default_factory=FlappingSpec)

    @model_validator(mode="after")
    def _consistent(self) -> RemediationSpec:
        if len(set(self.actions)) != len(self.actions):
            raise ValueError("health.remediation.actions: each action may appear once")
        if "external" in self.actions and self.externalHandoff is None:
            raise ValueError(
                "health.remediation.actions names external: set health.remediation.externalHandoff.label "
                "(the label another controller acts on)"
            )
        return self

    def unavailable_limit(self, total: int) -> int:
        """maxUnavailable as a node count (a percent of `total` rounded up; at least 1 when > 0%)."""
        value = self.maxUnavailable
        if isinstance(value, str) and value.endswith("%"):
            share = int(value[:-1])
            return 0 if share == 0 else max(1, -(-total * share // 100))
        return int(value)


class HealthSpec(Model):
    """GPU health (ours): signals from the health agent's report, and opt-in remediation."""

    taintEffect: Literal["NoSchedule", "NoExecute"] = Field(
        default="NoSchedule", description="Effect of the nvidia.com/gpu-unhealthy taint on quarantined nodes."
    )
    startupTaint: StartupTaintSpec = Field(default_factory=StartupTaintSpec)
    remediation: RemediationSpec = Field(default_factory=RemediationSpec)


__all__ = [
    "DEFAULT_ACTIONS",
    "READINESS_TAINT_PREFIX",
    "FlappingSpec",
    "HandoffSpec",
    "HealthSpec",
    "RemediationAction",
    "RemediationSpec",
    "StartupTaintSpec",
]
