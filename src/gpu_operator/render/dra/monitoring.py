"""state-dcgm and state-dcgm-exporter of the DRA stack: DCGM's host engine and exporter on nodes
whose GPUs are handed out by DRA. Both see every GPU of their node through a ResourceClaim with
admin access (allocation mode All), not through the device plugin's resource."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.common import ComponentFields
from gpu_operator.render.dra.common import DRACtx, claim_on, claim_template, daemonset
from gpu_operator.render.objects import (
    container,
    hostpath,
    obj,
    upsert_env,
)
from gpu_operator.render.operand import grant, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import service
from gpu_operator.render.states.dcgm import PORT as DCGM_PORT
from gpu_operator.render.states.dcgm_exporter import PORT, PORT_NAME, exporter_container, metrics_config
from gpu_operator.render.transforms.component import apply_component, apply_image
from gpu_operator.render.transforms.image import image_path
from gpu_operator.vocabulary import deploy_label

DCGM = "nvidia-dcgm-dra"
EXPORTER = "nvidia-dcgm-exporter-dra"
CLAIM = "admin-gpus"
READ = ["get", "list", "watch"]


def _account(ctx: DRACtx, state: str, name: str, rules: list[dict[str, Any]]) -> list[Manifest]:
    return [
        obj("v1", "ServiceAccount", name, state, ctx.ns),
        *grant("Role", name, state, ctx.ns, rules, name),
    ]


def _pod(
    ctx: DRACtx,
    state: str,
    name: str,
    main: dict[str, Any],
    fields: ComponentFields,
    image: tuple[str, str],
    template: str,
    volumes: list[dict[str, Any]] | None = None,
) -> Manifest:
    """The DaemonSet on nodes labelled nvidia.com/gpu.deploy.<name without nvidia-> = true; `image` is
    the spec field's path and the operator's env fallback."""
    pod: dict[str, Any] = {
        "serviceAccountName": name,
        "nodeSelector": {deploy_label(name.removeprefix("nvidia-")): "true"},
        "containers": [main],
        **({"volumes": volumes} if volumes else {}),
    }
    apply_image(main, pod, image_path(fields, image[1], dict(ctx.facts.operator_env), image[0]), fields)
    apply_component(pod, main, fields)
    claim_on(pod, main, CLAIM, template)
    return daemonset(
        ctx,
        state,
        name,
        pod,
        labels={"app": name},
        selector={"app": name},
        strategy={"type": "RollingUpdate"},
    )


def dcgm(ctx: DRACtx) -> list[Manifest]:
    state, fields = "state-dcgm", ctx.spec.dcgm
    assert fields is not None  # the state is enabled only with spec.dcgm.enabled=true
    port: dict[str, Any] = {"name": "dcgm", "containerPort": DCGM_PORT, "protocol": "TCP"}
    if fields.hostPort:
        port["hostPort"] = fields.hostPort
    probe = {"tcpSocket": {"port": DCGM_PORT}, "initialDelaySeconds": 15}
    main = container(
        "nvidia-dcgm-ctr", ports=[port], privileged=True, livenessProbe=probe, readinessProbe=dict(probe)
    )
    template = "nvidia-dcgm-admin"
    svc = service(DCGM, state, ctx.ns, DCGM_PORT, "dcgm", DCGM, internalTrafficPolicy="Local")
    return [
        *_account(ctx, state, DCGM, [rule(["resource.k8s.io"], ["resourceclaims"], READ)]),
        claim_template(ctx, state, template, CLAIM, all_devices=True),
        _pod(ctx, state, DCGM, main, fields, ("spec.dcgm", "DCGM_IMAGE"), template),
        svc,
    ]


def exporter(ctx: DRACtx) -> list[Manifest]:
    state, fields = "state-dcgm-exporter", ctx.spec.dcgmExporter
    assert fields is not None  # enabled only when the block is there
    main = exporter_container(EXPORTER, {"privileged": True})
    if ctx.spec.dcgm_on():
        upsert_env(main, "DCGM_REMOTE_HOSTENGINE_INFO", f"{DCGM}:{DCGM_PORT}")
    # metrics name the pod holding each GPU's claim, which the exporter reads from the API
    upsert_env(main, "KUBERNETES_ENABLE_DRA", "true")
    kubelet = ctx.kubelet_root().rstrip("/")
    volumes = [hostpath("pod-gpu-resources", f"{kubelet}/pod-resources")]
    template = "nvidia-dcgm-exporter-admin"
    ds = _pod(
        ctx, state, EXPORTER, main, fields, ("spec.dcgmExporter", "DCGM_EXPORTER_IMAGE"), template, volumes
    )
    pod = ds["spec"]["template"]["spec"]
    pod["automountServiceAccountToken"] = True
    metrics_config(pod, main, fields)
    svc_spec: dict[str, Any] = {}
    if fields.service and fields.service.type:
        svc_spec["type"] = fields.service.type
    read_pods = f"{EXPORTER}-read-pods"
    return [
        *_account(
            ctx,
            state,
            EXPORTER,
            [
                rule(["resource.k8s.io"], ["resourceclaims"], READ),
                rule([""], ["configmaps"], ["get", "list"]),
            ],
        ),
        *grant(
            "ClusterRole",
            read_pods,
            state,
            ctx.ns,
            [rule([""], ["pods"], READ), rule(["resource.k8s.io"], ["resourceslices"], READ)],
            EXPORTER,
        ),
        claim_template(ctx, state, template, CLAIM, all_devices=True),
        service(EXPORTER, state, ctx.ns, PORT, PORT_NAME, EXPORTER, scrape=True, **svc_spec),
        ds,
    ]
