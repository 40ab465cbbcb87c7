"""Label policies for node-labelling tests, built the way the operator builds them."""

from __future__ import annotations

from typing import Any

from gpu_operator.controllers.nodelabels import LabelPolicy


def label_policy(spec: dict[str, Any]) -> LabelPolicy:
    """LabelPolicy.from_spec of a spec the api model accepts (fails the test otherwise)."""
    policy = LabelPolicy.from_spec(spec)
    assert policy is not None, f"the api model rejects {spec}"
    return policy
