"""State 1, pre-requisites: the RuntimeClasses GPU pods run with (nvidia, nvidia-cdi, nvidia-legacy)."""

from __future__ import annotations

from gpu_operator.render.objects import Ctx, obj
from gpu_operator.render.operand import Operand
from gpu_operator.render.result import Manifest

CDI_CLASSES = ("nvidia-cdi", "nvidia-legacy")


def _api(ctx: Ctx) -> str:
    return "node.k8s.io/v1" if ctx.facts.k8s_minor() >= (1, 21) else "node.k8s.io/v1beta1"


def _gate(ctx: Ctx) -> tuple[bool, str]:
    if ctx.spec.cdi.nri():
        return False, "spec.cdi.nriPluginEnabled=true: the NRI plugin injects GPUs, no RuntimeClass needed"
    return True, "spec.cdi.nriPluginEnabled=false"


def _runtime_class(name: str, state: str, ctx: Ctx) -> Manifest:
    body = obj(_api(ctx), "RuntimeClass", name, state, None, handler=name)
    body["metadata"]["labels"]["app.kubernetes.io/component"] = "gpu-operator"
    return body


def _classes(ctx: Ctx) -> list[str]:
    return [ctx.spec.operator.runtimeClass, *(CDI_CLASSES if ctx.spec.cdi.on() else ())]


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    return [_runtime_class(name, state, ctx) for name in dict.fromkeys(_classes(ctx))]


OPERAND = Operand(state="pre-requisites", gate=_gate, extras=_extras)
