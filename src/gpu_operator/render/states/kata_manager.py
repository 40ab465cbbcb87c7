"""State 19, state-kata-manager: deprecated upstream and always disabled; only cleans up after itself."""

from __future__ import annotations

from gpu_operator.render.objects import Ctx
from gpu_operator.render.operand import Operand, rule
from gpu_operator.vocabulary import KATA_RUNTIME_CLASS

NAME = "nvidia-kata-manager"
# RuntimeClasses the old kata manager created carry KATA_RUNTIME_CLASS. This state renders nothing, so
# whatever an older version of this operator created for it (ownerReference to the policy) is deleted
# like any object no state renders; labelled RuntimeClasses someone else created are left alone.


def _gate(ctx: Ctx) -> tuple[bool, str]:
    return False, (
        f"deprecated: always disabled (spec.kataManager is ignored); objects the operator created "
        f"for it, RuntimeClasses labelled {KATA_RUNTIME_CLASS}=true included, are removed"
    )


OPERAND = Operand(
    state="state-kata-manager",
    gate=_gate,
    account=NAME,
    role_rules=(rule([""], ["configmaps"], ["get"]),),
    cluster_rules=(rule([""], ["nodes"], ["get", "list", "watch", "patch"]),),
)
