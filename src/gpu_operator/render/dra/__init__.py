"""The GPUCluster renderer (pure): a GPUCluster and the cluster's facts -> the objects of its four
states, in NVIDIA's order: state-dra-driver, state-dcgm, state-dcgm-exporter, state-dra-validation.

A disabled state renders nothing; the operator deletes what a GPUCluster owns and no state renders
any more (the same apply/delete contract as ClusterPolicy), so turning compute domains or DCGM off
removes their objects.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.render.dra import driver, monitoring, validation
from gpu_operator.render.dra.common import RESOURCE_API_VERSIONS, DRACtx, DRAFacts, DRANotServed
from gpu_operator.render.result import Manifest, RenderError, RenderResult, StateResult
from gpu_operator.render.transforms.hardening import harden

__all__ = ["RESOURCE_API_VERSIONS", "STATES", "DRAFacts", "DRANotServed", "render_gpucluster"]

DRAGate = Callable[[DRACtx], tuple[bool, str]]


def _dcgm(ctx: DRACtx) -> tuple[bool, str]:
    if ctx.spec.dcgm_on():
        return True, "spec.dcgm.enabled=true"
    return False, "spec.dcgm.enabled is not true (the DRA stack's DCGM host engine is off unless enabled)"


def _exporter(ctx: DRACtx) -> tuple[bool, str]:
    if ctx.spec.dcgmExporter is None:
        return False, "no spec.dcgmExporter"
    if ctx.spec.dcgm_exporter_on():
        return True, "spec.dcgmExporter present" + (
            "" if ctx.spec.dcgmExporter.enabled else " (enabled by default)"
        )
    return False, "spec.dcgmExporter.enabled=false"


def _always(reason: str) -> DRAGate:
    return lambda ctx: (True, reason)


STATES: tuple[tuple[str, DRAGate, Callable[[DRACtx], list[Manifest]]], ...] = (
    (driver.STATE, _always("always (the GPU kubelet plugin has no switch)"), driver.render),
    ("state-dcgm", _dcgm, monitoring.dcgm),
    ("state-dcgm-exporter", _exporter, monitoring.exporter),
    (validation.STATE, _always("always"), validation.render),
)


def render_gpucluster(cluster: GPUCluster, facts: DRAFacts) -> RenderResult:
    """Every state in order with its objects; raises RenderError (naming the field and the fix) for
    a GPUCluster that cannot be rendered, DRANotServed when the apiserver serves no DRA API."""
    if cluster.spec is None:
        raise RenderError(
            "spec.draDriver",
            "a GPUCluster needs spec.draDriver (e.g. `spec: {draDriver: {}}` for "
            "the chart's DRA driver image)",
        )
    ctx = DRACtx(cluster, facts)
    ctx.resource_api  # noqa: B018 - raises DRANotServed first, before any state
    states = []
    for name, gate, build in STATES:
        enabled, reason = gate(ctx)
        objects = build(ctx) if enabled else []
        for o in objects:
            if o["kind"] in ("DaemonSet", "Deployment"):
                harden(o)  # every ServiceAccount of the stack calls the apiserver
        states.append(StateResult(name, enabled, reason, objects))
    return RenderResult(states, warnings=cluster.warnings())
