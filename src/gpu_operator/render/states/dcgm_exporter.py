"""State 9, state-dcgm-exporter: GPU metrics for Prometheus (Service, ServiceMonitor, DaemonSet)."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.clusterpolicy import DCGMExporterSpec
from gpu_operator.render.objects import (
    NODE_NAME,
    Ctx,
    add_mount,
    add_volume,
    configmap_volume,
    container,
    env,
    get_env,
    hostpath,
    mount,
    obj,
    upsert_env,
)
from gpu_operator.render.operand import RBAC, DaemonSetDef, Image, Operand, rule
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import VALIDATIONS, service, service_monitor, wait_for, when_enabled
from gpu_operator.render.transforms.component import host_network

NAME = "nvidia-dcgm-exporter"
READ_PODS = "nvidia-dcgm-exporter-read-pods"
PORT = 9400
PORT_NAME = "gpu-metrics"
METRICS_FILE = "/etc/dcgm-exporter/dcgm-metrics.csv"
DEFAULT_JOB_MAPPING_DIR = "/var/lib/dcgm-exporter/job-mapping"


def pod_metadata_enrichment(ctx: Ctx) -> bool:
    """Pod labels/UIDs in metrics need read access to pods (from the spec or the user's env)."""
    spec = ctx.spec.dcgmExporter
    if spec.enablePodLabels or spec.enablePodUID:
        return True
    user_env = {e.name: e.value for e in spec.env or []}
    return any(user_env.get(f"DCGM_EXPORTER_KUBERNETES_ENABLE_POD_{k}") == "true" for k in ("LABELS", "UID"))


def exporter_container(name: str, security: dict[str, Any]) -> dict[str, Any]:
    """dcgm-exporter's container: its listen address, collectors, probes and the kubelet's
    pod-resources socket (which pod holds which GPU); shared with the DRA stack's exporter."""
    return container(
        name,
        env_vars=[
            env("DCGM_EXPORTER_LISTEN", f":{PORT}"),
            env("DCGM_EXPORTER_KUBERNETES", "true"),
            env("DCGM_EXPORTER_COLLECTORS", "/etc/dcgm-exporter/dcp-metrics-included.csv"),
            NODE_NAME,
        ],
        ports=[{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}],
        livenessProbe={
            "httpGet": {"port": PORT, "path": "/health"},
            "initialDelaySeconds": 45,
            "periodSeconds": 5,
        },
        readinessProbe={"httpGet": {"port": PORT, "path": "/health"}, "initialDelaySeconds": 45},
        mounts=[mount("pod-gpu-resources", "/var/lib/kubelet/pod-resources", readonly=True)],
        securityContext=security,
    )


def metrics_config(pod: dict[str, Any], main: dict[str, Any], spec: DCGMExporterSpec) -> None:
    """`config.name`: the metrics to collect come from that ConfigMap's dcgm-metrics.csv."""
    if spec.config and spec.config.name:
        upsert_env(main, "DCGM_EXPORTER_COLLECTORS", METRICS_FILE)
        add_volume(
            pod,
            configmap_volume(
                "metrics-config",
                spec.config.name,
                items=[{"key": "dcgm-metrics.csv", "path": "dcgm-metrics.csv"}],
            ),
        )
        add_mount(main, mount("metrics-config", METRICS_FILE, readonly=True, sub_path="dcgm-metrics.csv"))


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    kubelet = ctx.spec.hostPaths.kubeletRootDir.rstrip("/")
    main = exporter_container(
        "nvidia-dcgm-exporter", {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    )
    return {
        "initContainers": [wait_for("toolkit", "toolkit-ready")],
        "containers": [main],
        "volumes": [VALIDATIONS, hostpath("pod-gpu-resources", f"{kubelet}/pod-resources")],
    }


def _exporter(ds: dict[str, Any], ctx: Ctx) -> None:
    spec = ctx.spec.dcgmExporter
    template = ds["spec"]["template"]
    pod = template["spec"]
    main = pod["containers"][0]
    if ctx.spec.dcgm.on():
        upsert_env(main, "DCGM_REMOTE_HOSTENGINE_INFO", f"nvidia-dcgm:{5555}")
    elif (get_env(main, "DCGM_REMOTE_HOSTENGINE_INFO") or "").startswith("localhost"):
        host_network(pod, True)  # a host engine on the node is only reachable on the host network
    if spec.hostPID:
        pod["hostPID"] = True
    if spec.hpcJobMapping and spec.hpcJobMapping.enabled:
        directory = spec.hpcJobMapping.directory or DEFAULT_JOB_MAPPING_DIR
        upsert_env(main, "DCGM_HPC_JOB_MAPPING_DIR", directory)
        add_volume(pod, hostpath("hpc-job-mapping", directory, "DirectoryOrCreate"))
        add_mount(main, mount("hpc-job-mapping", directory, readonly=True))
    if spec.enablePodLabels:
        upsert_env(main, "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "true")
    if spec.enablePodUID:
        upsert_env(main, "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "true")
    if spec.podLabelAllowlistRegex:
        upsert_env(
            main, "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX", ",".join(spec.podLabelAllowlistRegex)
        )
    if pod_metadata_enrichment(ctx):
        pod["automountServiceAccountToken"] = True
    metrics_config(pod, main, spec)
    if spec.annotations:
        template["metadata"].setdefault("annotations", {}).update(spec.annotations)


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    spec = ctx.spec.dcgmExporter
    svc_spec: dict[str, Any] = {}
    if spec.service and spec.service.type:
        svc_spec["type"] = spec.service.type
    svc_spec["internalTrafficPolicy"] = (
        spec.service.internalTrafficPolicy if spec.service else None
    ) or "Cluster"
    out = [service(NAME, state, ctx.ns, PORT, PORT_NAME, NAME, scrape=True, **svc_spec)]
    monitor = spec.serviceMonitor
    if monitor and monitor.enabled:
        out += service_monitor(
            NAME,
            state,
            ctx,
            PORT_NAME,
            NAME,
            interval=monitor.interval or "15s",
            scrape_timeout=monitor.scrapeTimeout,
            honor_labels=monitor.honorLabels,
            labels=monitor.additionalLabels,
            relabelings=monitor.relabelings,
        )
    if pod_metadata_enrichment(ctx):
        out.append(
            obj(
                RBAC,
                "ClusterRole",
                READ_PODS,
                state,
                None,
                rules=[rule([""], ["pods"], ["get", "list", "watch"])],
            )
        )
        out.append(
            obj(
                RBAC,
                "ClusterRoleBinding",
                READ_PODS,
                state,
                None,
                subjects=[{"kind": "ServiceAccount", "name": NAME, "namespace": ctx.ns}],
                roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READ_PODS},
            )
        )
    return out


OPERAND = Operand(
    state="state-dcgm-exporter",
    gate=when_enabled("dcgmExporter"),
    account=NAME,
    role_rules=(rule([""], ["configmaps"], ["get", "list"]),),
    extras=_extras,
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="dcgm-exporter",
        image=Image("dcgmExporter", "DCGM_EXPORTER_IMAGE"),
        pod=_pod,
        gpu_access=True,
        transforms=(_exporter,),
    ),
)
