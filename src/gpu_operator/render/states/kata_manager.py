"""State 19, state-kata-manager: deprecated upstream and always disabled; only cleans up after itself."""

from __future__ import annotations

from gpu_operator.render.objects import Ctx
from gpu_operator.render.operand import Operand, rule
from gpu_operator.vocabulary import KATA_RUNTIME_CLASS

NAME = "nvidia-kata-manager"
# RuntimeClasses the old kata manager created carry KATA_RUNTIME_CLASS; the operator deletes them by label.


def _gate(ctx: Ctx) -> tuple[bool, str]:
    return False, (f"deprecated: always disabled (spec.kataManager is ignored); its objects and every "
                   f"RuntimeClass labelled {KATA_RUNTIME_CLASS}=true are removed")


OPERAND = Operand(
    state="state-kata-manager",
    gate=_gate,
    account=NAME,
    role_rules=(rule([""], ["configmaps"], ["get"]),),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch"]),),
)
