"""The operator's environment, read once at start into one typed object: the reconcilers are
handed what it says and never read the process environment themselves."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_operator.render.facts import operator_env

NAMESPACE_VARIABLE = "OPERATOR_NAMESPACE"


def operator_env_now() -> dict[str, str]:
    """The operand images (`*_IMAGE`) of this process's environment now: for a reconciler built
    without an `Environment` (tests, hand-run tools); the operator passes `Environment.images`."""
    return operator_env(os.environ)


@dataclass(frozen=True)
class Environment:
    """`namespace`: where the operator runs (OPERATOR_NAMESPACE, set by the chart from the
    downward API); `images`: the operand images its Deployment sets (`*_IMAGE`, non-empty ones),
    what rendering uses where the policy names no image."""

    namespace: str = ""
    images: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Environment:
        return cls(environ.get(NAMESPACE_VARIABLE, ""), operator_env(environ))
