"""Pure rendering: (ClusterPolicy, cluster facts) -> every object of every state, in apply order."""

from __future__ import annotations

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.render.facts import ClusterFacts
from gpu_operator.render.objects import Ctx
from gpu_operator.render.operand import render_operand
from gpu_operator.render.result import Manifest, ObjectRef, RenderError, RenderResult, StateResult
from gpu_operator.render.states import ORDER

__all__ = [
    "ClusterFacts",
    "Manifest",
    "ObjectRef",
    "RenderError",
    "RenderResult",
    "StateResult",
    "check_policy",
    "render",
]


def check_policy(policy: ClusterPolicy) -> None:
    """Cross-field rules the CRD also enforces (CEL), for objects that bypassed it."""
    spec = policy.spec
    if spec.cdi.nri() and not spec.cdi.on():
        raise RenderError(
            "spec.cdi.nriPluginEnabled",
            "the NRI plugin injects CDI devices: set spec.cdi.enabled=true or turn NRI off",
        )
    if spec.cdi.nri() and not spec.toolkit.on():
        raise RenderError(
            "spec.cdi.nriPluginEnabled",
            "the NRI plugin is installed by the toolkit: set spec.toolkit.enabled=true or turn NRI off",
        )
    if spec.devicePlugin.config and spec.devicePlugin.config.default and not spec.devicePlugin.config.name:
        raise RenderError(
            "spec.devicePlugin.config.default",
            "a default config needs spec.devicePlugin.config.name (the ConfigMap holding the configs)",
        )


def render(policy: ClusterPolicy, facts: ClusterFacts) -> RenderResult:
    """Every state in upstream order: enabled or not and why, objects in apply order."""
    check_policy(policy)
    ctx = Ctx(policy, facts)
    states: list[StateResult] = []
    for operand in ORDER:
        enabled, reason = operand.gate(ctx)
        if not enabled:
            orphan = bool(operand.orphan_pods and operand.orphan_pods(ctx))
            states.append(StateResult(operand.state, False, reason, [], orphan))
            continue
        objects, note = render_operand(operand, ctx)
        states.append(StateResult(operand.state, True, reason + note, objects))
    keep = frozenset() if facts.has_gpu_nodes else frozenset({"DaemonSet"})
    return RenderResult(states=states, warnings=policy.warnings(), keep_kinds=keep)
