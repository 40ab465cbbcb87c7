"""GPU nodes whose container runtime no toolkit DaemonSet serves (render/states/container_toolkit.py
`unserved`): the ClusterPolicy's status names them and the toolkit.env keys to set, and each such
node gets one Warning Event per message (docs/distributions.md)."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers import status as st
from gpu_operator.kube.client import Kube
from gpu_operator.render.facts import ClusterFacts
from gpu_operator.render.objects import Ctx
from gpu_operator.render.states.container_toolkit import unserved
from gpu_operator.vocabulary import NOT_READY, READY, RUNTIME_NOT_RECOGNISED


def unserved_nodes(policy: ClusterPolicy, facts: ClusterFacts) -> dict[str, str]:
    """node -> message, for the container-workload GPU nodes whose runtime is not recognised."""
    return unserved(Ctx(policy, facts))


def outcome(result: st.ReconcileOutcome, problems: Mapping[str, str]) -> st.ReconcileOutcome:
    """Not ready while a node's runtime is unrecognised: the message names each node and the fix
    (a reconcile failure or an operand not ready keeps its own message)."""
    if not problems or result.state != READY:
        return result
    return st.ReconcileOutcome(
        NOT_READY, RUNTIME_NOT_RECOGNISED, "; ".join(problems[n] for n in sorted(problems))
    )


async def node_events(kube: Kube, problems: Mapping[str, str], sent: set[tuple[str, ...]]) -> None:
    """One Warning Event on each node per distinct message (`sent` remembers them)."""
    for node in sorted(problems):
        key = ("runtime", node, problems[node])
        if key in sent:
            continue
        await kube.event(
            {"apiVersion": "v1", "kind": "Node", "name": node}, RUNTIME_NOT_RECOGNISED, problems[node]
        )
        sent.add(key)
