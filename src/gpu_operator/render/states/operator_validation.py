"""State 5, state-operator-validation: validates driver, toolkit, CUDA and device plugin per node."""

from __future__ import annotations

import copy
from typing import Any

from gpu_operator.api.clusterpolicy import EnvOnly
from gpu_operator.render.defaults import CUDA_WORKLOAD_IMAGE
from gpu_operator.render.objects import (
    NODE_NAME,
    OPERATOR_NAMESPACE,
    Ctx,
    container,
    env,
    find,
    hostpath,
    mount,
    remove_containers,
    upsert_env,
)
from gpu_operator.render.operand import VALIDATOR, DaemonSetDef, Operand, nvidia_selector, rule
from gpu_operator.render.result import Manifest, RenderError
from gpu_operator.render.states._common import (
    DRIVER_INSTALL_DIR,
    HOST_DEV_CHAR,
    HOST_ROOT,
    VALIDATIONS,
    always,
    service,
    service_monitor,
    validator_init,
)
from gpu_operator.render.transforms.component import env_upsert
from gpu_operator.render.transforms.runtime import runtime_class_name
from gpu_operator.vocabulary import (
    CUDA_WORKLOAD_ENV,
    CUDA_WORKLOADS,
    HEALTH_REQUESTS_SECRET,
    HEALTH_VALIDATIONS,
    VALIDATIONS_DIR,
)

STATE = "state-operator-validation"
NAME = "nvidia-operator-validator"
ROOT = {"runAsUser": 0}
# Ours: the GPU health agent (`gpu-operator node health`) runs beside the validator on every GPU
# node of the container workload; it reads the host's kernel log, sysfs and procfs through the
# host root, the validator's status files, and NVML (NVIDIA_VISIBLE_DEVICES=all: the toolkit injects
# the driver's library), and patches its Node's report annotation.
HEALTH = "gpu-health"
HEALTH_PORT = 8010
HEALTH_PORT_NAME = "health-metrics"
HEALTH_SERVICE = "nvidia-gpu-health"
# The host's /run, writable under the read-only host root: where the agent creates kured's reboot
# sentinel (/var/run/reboot-required) when remediation asks for a reboot (docs/health.md).
HOST_RUN = hostpath("host-run", "/run", "Directory")


def health_container() -> dict[str, Any]:
    """The GPU health agent's container, privileged and root (also in the DRA stack's validator:
    render/dra/validation.py); its image is the validator's, set by the caller."""
    return container(
        HEALTH,
        command=["gpu-operator", "node", "health"],
        args=["--host-root", "/host"],
        env_vars=[
            copy.deepcopy(NODE_NAME),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("HEALTH_METRICS_PORT", str(HEALTH_PORT)),
            env("HEALTH_VALIDATIONS", ",".join(HEALTH_VALIDATIONS)),
            # where the operator's remediation requests are (docs/health.md, "Who can trigger what")
            copy.deepcopy(OPERATOR_NAMESPACE),
        ],
        mounts=[
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("host-run", "/host/run"),
        ],
        securityContext={
            "privileged": True,
            **ROOT,
        },  # /dev/kmsg needs CAP_SYSLOG where dmesg_restrict is set
        ports=[{"name": HEALTH_PORT_NAME, "containerPort": HEALTH_PORT, "protocol": "TCP"}],
    )


def _extras(ctx: Ctx, state: str) -> list[Manifest]:
    """The health agent's metrics: a Service Prometheus finds by annotation, and a ServiceMonitor
    where the CRD exists (as the node-status exporter's)."""
    return [
        service(HEALTH_SERVICE, state, ctx.ns, HEALTH_PORT, HEALTH_PORT_NAME, NAME, scrape=True),
        *service_monitor(HEALTH_SERVICE, state, ctx, HEALTH_PORT_NAME, NAME),
    ]


def _pod(ctx: Ctx, image: str) -> dict[str, Any]:
    validations = mount("run-nvidia-validations", VALIDATIONS_DIR, propagation="Bidirectional")
    driver = validator_init(
        "driver",
        mounts=[
            mount("driver-install-dir", "/run/nvidia/driver", propagation="HostToContainer"),
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("host-dev-char", "/host-dev-char"),
            validations,
        ],
    )
    inits = [
        driver,
        # the validator image sets NVIDIA_VISIBLE_DEVICES=void; the toolkit check needs the driver injected
        validator_init("toolkit", env("NVIDIA_VISIBLE_DEVICES", "all"), wait=False),
        validator_init("cuda", wait=False),
        validator_init("plugin", wait=False),
    ]
    main = container(
        NAME,
        command=["sh", "-c"],
        args=["echo all validations are successful; sleep infinity"],
        mounts=[validations],
        lifecycle={"preStop": {"exec": {"command": ["sh", "-c", f"rm -f {VALIDATIONS_DIR}/*-ready"]}}},
        privileged=True,
    )
    return {
        "initContainers": inits,
        "containers": [main, health_container()],
        "volumes": [VALIDATIONS, DRIVER_INSTALL_DIR, HOST_ROOT, HOST_DEV_CHAR, copy.deepcopy(HOST_RUN)],
    }


def _runs_vector_add(component: str, extra: EnvOnly | None) -> bool:
    """Whether this validator container's workload pod runs NVIDIA's vectorAdd: its workload is on
    (the cuda check's by default, the plugin check's only when the user's env turns it on) and the
    user's CUDA_WORKLOAD is not driver-api. A CUDA_WORKLOAD the validator would refuse is refused here."""
    user = {e.name: e.value for e in (extra.env if extra is not None and extra.env else [])}
    workload = user.get(CUDA_WORKLOAD_ENV) or CUDA_WORKLOADS[0]
    if workload not in CUDA_WORKLOADS:
        raise RenderError(
            f"spec.validator.{component}.env",
            f"{CUDA_WORKLOAD_ENV}={workload!r}: use one of {', '.join(CUDA_WORKLOADS)} "
            f"(default {CUDA_WORKLOADS[0]})",
        )
    with_workload = user.get("WITH_WORKLOAD") or ("true" if component == "cuda" else "false")
    return workload == "vectorAdd" and with_workload.strip().lower() not in ("0", "false", "no", "off")


def _validator(ds: dict[str, Any], ctx: Ctx) -> None:
    """Per-component env, workload-pod settings, and no plugin check without a device plugin."""
    pod = ds["spec"]["template"]["spec"]
    spec = ctx.spec
    health = find(pod, HEALTH)
    if health is not None:  # our image, pulled as the validator's
        main = pod["containers"][0]
        health["image"], health["imagePullPolicy"] = main["image"], main["imagePullPolicy"]
    if not spec.devicePlugin.on():
        remove_containers(pod, "plugin-validation")
        if health is not None:  # no plugin-ready file will come
            upsert_env(health, "HEALTH_VALIDATIONS", ",".join(c for c in HEALTH_VALIDATIONS if c != "plugin"))
    per_component = {
        "driver": spec.validator.driver,
        "toolkit": spec.validator.toolkit,
        "cuda": spec.validator.cuda,
        "plugin": spec.validator.plugin,
    }
    image = VALIDATOR.resolve(ctx)
    secrets = ",".join(spec.validator.imagePullSecrets or [])
    for component, extra in per_component.items():
        ctr = find(pod, f"{component}-validation")
        if ctr is None:
            continue
        ctr.setdefault("securityContext", {}).update(ROOT)
        if component in ("cuda", "plugin"):
            # the validator starts workload pods with these settings
            upsert_env(ctr, "VALIDATOR_IMAGE", image)
            if _runs_vector_add(component, extra):
                # vectorAdd: an image that has it (ours has not); only where a pod would pull it, so that
                # an install's image list (render/images.py) names NVIDIA's image only when it is used
                upsert_env(
                    ctr,
                    "CUDA_VALIDATOR_IMAGE",
                    ctx.facts.operator_env.get("CUDA_VALIDATOR_IMAGE") or CUDA_WORKLOAD_IMAGE,
                )
            upsert_env(ctr, "VALIDATOR_IMAGE_PULL_POLICY", ctr["imagePullPolicy"])
            if secrets:
                upsert_env(ctr, "VALIDATOR_IMAGE_PULL_SECRETS", secrets)
            runtime_class = runtime_class_name(spec, ctx.facts.runtime)
            if runtime_class:
                upsert_env(ctr, "VALIDATOR_RUNTIME_CLASS", runtime_class)
        if component == "plugin":
            upsert_env(ctr, "WITH_WORKLOAD", "false")
            # always, as upstream (empty when unset: the validator then assumes single)
            upsert_env(ctr, "MIG_STRATEGY", spec.mig.strategy or "")
        if extra is not None:
            env_upsert(ctr, extra.env)
    pod["containers"][0].setdefault("securityContext", {}).update(ROOT)


OPERAND = Operand(
    state=STATE,
    gate=always("always enabled"),
    account=NAME,
    role_rules=(
        rule([""], ["pods"], ["get", "list", "watch", "create", "delete"]),
        rule(["apps"], ["daemonsets"], ["get", "list"]),
        # the health agent reads the operator's remediation requests: that one Secret, by name;
        # it never writes it (docs/health.md, "Who can trigger what")
        rule([""], ["secrets"], ["get", "list", "watch"], [HEALTH_REQUESTS_SECRET]),
    ),
    # patch: the health agent's report annotation on its own Node
    cluster_rules=(
        rule([""], ["nodes"], ["get", "list", "watch", "patch"]),
        # the workload pods' owner is the ClusterPolicy, with blockOwnerDeletion
        rule(["nvidia.com"], ["clusterpolicies/finalizers"], ["update"]),
    ),
    extras=_extras,
    daemonset=DaemonSetDef(
        name=NAME,
        deploy="operator-validator",
        image=VALIDATOR,
        pod=_pod,
        gpu_access=True,
        transforms=(_validator,),
        selector=nvidia_selector(NAME, part_of="gpu-operator"),
    ),
)
