"""Label policies for node-labelling tests, built the way the operator builds them: the
ClusterPolicy's view parsed by the api model (controllers/views.py), then LabelPolicy.of its spec
(controllers/units/labels/unit.py)."""

from __future__ import annotations

from typing import Any

from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy
from gpu_operator.controllers.views import ClusterPolicyView


def policy_of(spec: dict[str, Any]) -> LabelPolicy | None:
    """The policy of a ClusterPolicy with this spec; None when the api model rejects it (the
    labeller then labels by nothing new)."""
    body = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "uid": "u"},
        "spec": spec,
    }
    model = ClusterPolicyView.of(body).parsed.model
    return LabelPolicy.of(model.spec) if model is not None else None


def label_policy(spec: dict[str, Any]) -> LabelPolicy:
    """policy_of a spec the api model accepts (fails the test otherwise)."""
    policy = policy_of(spec)
    assert policy is not None, f"the api model rejects {spec}"
    return policy
