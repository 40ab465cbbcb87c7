"""State 2, state-operator-metrics: the Service (and ServiceMonitor) for the operator's own metrics."""

from __future__ import annotations

from gpu_operator.render.objects import Ctx, obj
from gpu_operator.render.operand import RBAC, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import always, service, service_monitor

STATE = "state-operator-metrics"
NAME = "gpu-operator"
PORT_NAME = "gpu-operator-metrics"
PROMETHEUS = "prometheus-k8s"


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    out = [service(NAME, state, ctx.ns, 8080, PORT_NAME, NAME, scrape=True)]
    monitor = ctx.spec.operator.metrics.serviceMonitor if ctx.spec.operator.metrics else None
    out += service_monitor(
        NAME,
        state,
        ctx,
        PORT_NAME,
        NAME,
        interval=monitor.interval if monitor else None,
        scrape_timeout=monitor.scrapeTimeout if monitor else None,
        honor_labels=monitor.honorLabels if monitor else None,
        labels=monitor.additionalLabels if monitor else None,
        relabelings=monitor.relabelings if monitor else None,
    )
    if ctx.facts.openshift:
        # OpenShift's cluster Prometheus scrapes only namespaces that grant it read access
        out.append(
            obj(
                RBAC,
                "Role",
                PROMETHEUS,
                state,
                ctx.ns,
                rules=[rule([""], ["services", "endpoints", "pods"], ["get", "list", "watch"])],
            )
        )
        out.append(
            obj(
                RBAC,
                "RoleBinding",
                PROMETHEUS,
                state,
                ctx.ns,
                subjects=[
                    {"kind": "ServiceAccount", "name": PROMETHEUS, "namespace": "openshift-monitoring"}
                ],
                roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROMETHEUS},
            )
        )
    return out


OPERAND = Operand(
    state=STATE,
    gate=always("always enabled"),
    extras=_extras,
)
