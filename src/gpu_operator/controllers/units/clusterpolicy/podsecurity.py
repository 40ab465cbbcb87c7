"""`psa.enabled`: the operator's namespace gets Pod Security Admission's `privileged` level
(enforce, audit, warn), since its operands run privileged with host paths; the operator pod
itself stays within `restricted` (the chart's securityContext). Only that namespace is touched,
and a label left off (psa disabled) is not taken away: a user may have set it."""

from __future__ import annotations

import logging

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.kube.client import Kube

log = logging.getLogger("gpu_operator.podsecurity")

PSA_LEVEL = "privileged"
PSA_MODES = ("enforce", "audit", "warn")


def namespace_labels(policy: ClusterPolicy) -> dict[str, str]:
    """The Pod Security labels the policy asks for on the operator's namespace ({} for none)."""
    if not policy.spec.psa.is_enabled(False):
        return {}
    return {f"pod-security.kubernetes.io/{mode}": PSA_LEVEL for mode in PSA_MODES}


class NamespaceLabeller:
    """Writes the labels once per change of what the policy asks (not on every reconcile)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._written: tuple[str, tuple[tuple[str, str], ...]] | None = None

    async def ensure(self, policy: ClusterPolicy, namespace: str) -> None:
        labels = namespace_labels(policy)
        wanted = (namespace, tuple(sorted(labels.items())))
        if not labels or wanted == self._written:
            return
        await self.kube.merge_patch("v1", "Namespace", namespace, {"metadata": {"labels": labels}})
        log.info(
            "namespace %s: Pod Security Admission labels %s (psa.enabled)",
            namespace,
            ", ".join(f"{k}={v}" for k, v in sorted(labels.items())),
        )
        self._written = wanted
