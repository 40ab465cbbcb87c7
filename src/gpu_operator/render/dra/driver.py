"""state-dra-driver: NVIDIA's DRA driver (kubelet plugin DaemonSet with its `gpus` and
`compute-domains` containers, the compute-domain controller), its RBAC, the DeviceClasses its
devices are claimed through, and the admission policy that keeps each plugin to its own node's
ResourceSlices (those two in render/dra/claims.py)."""

from __future__ import annotations

from typing import Any

from lightkube.utils.quantity import parse_quantity

from gpu_operator.api.gpucluster import (
    COMPUTE_DOMAINS_HEALTHCHECK_PORT,
    DRA_DRIVER_IMAGE_ENV,
    GPUS_HEALTHCHECK_PORT,
    KubeletPluginSpec,
)
from gpu_operator.render.dra.claims import device_classes, slice_policy
from gpu_operator.render.dra.common import (
    DRACtx,
    daemonset,
)
from gpu_operator.render.dra.rbac import driver_rbac
from gpu_operator.render.objects import (
    NAMESPACE,
    NODE_NAME,
    OPERATOR_NAMESPACE,
    POD_NAME,
    container,
    env,
    hostpath,
    mount,
    obj,
)
from gpu_operator.render.operand import VALIDATOR
from gpu_operator.render.result import Manifest, RenderError
from gpu_operator.render.transforms.component import env_upsert, pull_secrets, requirements
from gpu_operator.render.transforms.image import image_path, pull_policy
from gpu_operator.vocabulary import GPU_PRESENT, NFD_GPU_LABELS, VALIDATIONS_DIR, deploy_label

STATE = "state-dra-driver"
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
PLUGIN_ACCOUNT = "nvidia-dra-driver-kubeletplugin"
CONTROLLER = "nvidia-dra-driver-controller"
APP_NAME = "nvidia-dra-driver"

# The kubelet plugin's containers take their driver location from the validator's driver-ready
# file, may hide the driver's ModifyDeviceFiles switch from themselves, then start the plugin.
_PLUGIN_START = """set -a
. {validations}/driver-ready
set +a
if [ "$MASK_NVIDIA_DRIVER_PARAMS" = "true" ]; then
  cp /proc/driver/nvidia/params /root/gpu-params
  sed -i 's/^ModifyDeviceFiles: 1$/ModifyDeviceFiles: 0/' /root/gpu-params
  mount --bind /root/gpu-params /proc/driver/nvidia/params
fi
exec {program} -v "$LOG_VERBOSITY"
"""


def driver_image(ctx: DRACtx) -> str:
    return image_path(
        ctx.spec.draDriver, DRA_DRIVER_IMAGE_ENV, dict(ctx.facts.operator_env), "spec.draDriver"
    )


def validator_image(ctx: DRACtx) -> str:
    """The DRA stack's validation containers run our image, named by the operator's env (a GPUCluster
    has no validator field; the chart sets the variable)."""
    image = ctx.facts.operator_env.get(VALIDATOR.env, "")
    if not image:
        raise RenderError(
            VALIDATOR.env,
            f"the operator has no env var {VALIDATOR.env} (the image of the driver "
            "validation and DRA validation containers): set it in the operator's Deployment (the "
            "chart sets it from validator.*)",
        )
    return image


def _labels(component: str) -> dict[str, str]:
    return {"app": component, "app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/component": component}


def _feature_gates(ctx: DRACtx) -> list[dict[str, Any]]:
    gates = ctx.feature_gates
    if not gates:
        return []
    return [env("FEATURE_GATES", ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items())))]


def larger(a: str, b: str) -> str:
    """The larger of two resource quantities, as written (the API model checked both are quantities)."""
    left, right = parse_quantity(a), parse_quantity(b)
    assert left is not None and right is not None
    return b if right > left else a


def _probes(ctr: dict[str, Any], port: int | None, liveness_period: int) -> None:
    if port is None:
        return
    grpc = {"port": port, "service": "liveness"}
    ctr["startupProbe"] = {"grpc": grpc, "periodSeconds": 1, "failureThreshold": 600, "timeoutSeconds": 10}
    ctr["livenessProbe"] = {
        "grpc": dict(grpc),
        "periodSeconds": liveness_period,
        "failureThreshold": 3,
        "timeoutSeconds": 10,
    }


def plugin_mounts(kubelet: str) -> list[dict[str, Any]]:
    """What both plugin containers mount: the kubelet's plugin directories, CDI specs, the status
    files (read-only), the host and the driver root."""
    return [
        mount("plugins-registry", f"{kubelet}/plugins_registry"),
        mount("plugins", f"{kubelet}/plugins", propagation="Bidirectional"),
        mount("cdi", "/var/run/cdi"),
        mount("validations", VALIDATIONS_DIR, readonly=True),
        mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
        mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
    ]


def _plugin_container(
    ctx: DRACtx,
    name: str,
    program: str,
    spec: KubeletPluginSpec | None,
    port: int | None,
    *,
    http: str,
    gpus: bool,
    image: str,
) -> dict[str, Any]:
    kubelet = ctx.kubelet_root()
    env_vars = [
        env("HTTP_ENDPOINT", http),
        env("METRICS_PATH", "/metrics"),
        env("LOG_VERBOSITY", "4"),
        env("MASK_NVIDIA_DRIVER_PARAMS", ""),
        env("NVIDIA_VISIBLE_DEVICES", "void"),
        env("CDI_ROOT", "/var/run/cdi"),
    ]
    if gpus:
        env_vars.append(env("HOST_ROOT", "/host"))
    env_vars += [env("NVIDIA_MIG_CONFIG_DEVICES", "all"), NODE_NAME, NAMESPACE]
    if gpus:
        env_vars.append(env("IMAGE_NAME", image))
    env_vars += [
        env("KUBELET_REGISTRAR_DIRECTORY_PATH", f"{kubelet}/plugins_registry"),
        env("KUBELET_PLUGINS_DIRECTORY_PATH", f"{kubelet}/plugins"),
    ]
    if port is not None:
        env_vars.append(env("HEALTHCHECK_PORT", str(port)))
    if not gpus:
        env_vars.append(env("GPU_CLIQUE_LABEL_ENABLED", "true"))
    env_vars += _feature_gates(ctx)
    mounts = plugin_mounts(kubelet)
    if gpus and ctx.gate_on("PassthroughSupport"):
        mounts += [
            mount("host-lib-modules", "/lib/modules", readonly=True, propagation="HostToContainer"),
            mount("host-sys", "/sys", propagation="Bidirectional"),
            mount("host-proc", "/proc", propagation="Bidirectional"),
        ]
    ctr = container(
        name,
        command=["bash", "-c"],
        args=[_PLUGIN_START.format(validations=VALIDATIONS_DIR, program=program)],
        env_vars=env_vars,
        mounts=mounts,
        privileged=True,
        image=image,
    )
    ctr["imagePullPolicy"] = pull_policy(ctx.spec.draDriver.imagePullPolicy)
    env_upsert(ctr, spec.env if spec else None)
    limits = requirements(spec.resources if spec else None)
    if limits:
        ctr["resources"] = limits
    _probes(ctr, port, liveness_period=30 if gpus else 10)
    return ctr


def _max_resources(*containers: dict[str, Any]) -> dict[str, Any] | None:
    """Per resource the largest of the containers' requests and limits (limits at least the
    requests): the init container runs alone before them, so it may use what they will."""
    out: dict[str, dict[str, str]] = {}
    for ctr in containers:
        for key in ("requests", "limits"):
            for resource, value in (ctr.get("resources", {}).get(key) or {}).items():
                current = out.setdefault(key, {}).get(resource)
                out[key][resource] = value if current is None else larger(current, value)
    for resource, value in out.get("requests", {}).items():
        limits = out.get("limits", {})
        if resource in limits:
            limits[resource] = larger(limits[resource], value)
    return out or None


def _driver_validation(ctx: DRACtx, *mains: dict[str, Any]) -> dict[str, Any]:
    ctr = container(
        "driver-validation",
        command=["nvidia-validator"],
        image=validator_image(ctx),
        env_vars=[
            env("COMPONENT", "driver"),
            env("WITH_WAIT", "true"),
            # the GPUs may sit on vfio-pci (passthrough): check the driver without using them
            env("DRIVER_VALIDATION_SKIP_GPU_INIT", "true"),
            env("DISABLE_DEV_CHAR_SYMLINK_CREATION", "true"),
            OPERATOR_NAMESPACE,
            env("HOST_ROOT", "/"),
            env("DRIVER_INSTALL_DIR", ctx.driver_root()),
            env("DRIVER_INSTALL_DIR_CTR_PATH", "/driver-root"),
        ],
        mounts=[
            mount("host-root", "/host", readonly=True, propagation="HostToContainer"),
            mount("driver-install-dir", "/driver-root", propagation="HostToContainer"),
            mount("validations", VALIDATIONS_DIR),
        ],
        privileged=True,
    )
    ctr["imagePullPolicy"] = pull_policy(ctx.spec.draDriver.imagePullPolicy)
    ctr["securityContext"]["runAsUser"] = 0
    limits = _max_resources(*mains)
    if limits:
        ctr["resources"] = limits
    return ctr


def _node_affinity() -> dict[str, Any]:
    """A node with an NVIDIA PCI device (NFD's label), an NVIDIA CPU (Grace) or a GPU we found."""
    terms = [
        (NFD_GPU_LABELS[0], "true"),
        ("feature.node.kubernetes.io/cpu-model.vendor_id", "NVIDIA"),
        (GPU_PRESENT, "true"),
    ]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                    for key, value in terms
                ]
            }
        }
    }


def plugin_daemonset(ctx: DRACtx) -> Manifest:
    draft = ctx.spec.draDriver
    image = driver_image(ctx)
    gpus_spec = draft.gpus.kubeletPlugin if draft.gpus else None
    gpus_health = gpus_spec.healthcheck if gpus_spec else None
    gpus_port = gpus_health.resolved_port(GPUS_HEALTHCHECK_PORT) if gpus_health else GPUS_HEALTHCHECK_PORT
    mains = [
        _plugin_container(
            ctx, "gpus", "gpu-kubelet-plugin", gpus_spec, gpus_port, http=":8080", gpus=True, image=image
        )
    ]
    if draft.compute_domains_on():
        cd_spec = draft.computeDomains.kubeletPlugin if draft.computeDomains else None
        cd_health = cd_spec.healthcheck if cd_spec else None
        cd_port = (
            cd_health.resolved_port(COMPUTE_DOMAINS_HEALTHCHECK_PORT)
            if cd_health
            else COMPUTE_DOMAINS_HEALTHCHECK_PORT
        )
        mains.append(
            _plugin_container(
                ctx,
                "compute-domains",
                "compute-domain-kubelet-plugin",
                cd_spec,
                cd_port,
                http=":8081",
                gpus=False,
                image=image,
            )
        )
    kubelet = ctx.kubelet_root()
    volumes = [
        hostpath("plugins-registry", f"{kubelet}/plugins_registry"),
        hostpath("plugins", f"{kubelet}/plugins"),
        hostpath("cdi", "/var/run/cdi"),
        hostpath("host-root", "/"),
        hostpath("driver-install-dir", ctx.driver_root(), "DirectoryOrCreate"),
        hostpath("validations", VALIDATIONS_DIR, "DirectoryOrCreate"),
    ]
    if ctx.gate_on("PassthroughSupport"):
        volumes += [
            hostpath("host-lib-modules", "/lib/modules/", "Directory"),
            hostpath("host-sys", "/sys/", "Directory"),
            hostpath("host-proc", "/proc/", "Directory"),
        ]
    pod: dict[str, Any] = {
        "serviceAccountName": PLUGIN_ACCOUNT,
        "nodeSelector": {deploy_label("dra-driver"): "true"},
        "affinity": _node_affinity(),
        "initContainers": [_driver_validation(ctx, *mains)],
        "containers": mains,
        "volumes": volumes,
    }
    pull_secrets(pod, draft.imagePullSecrets)
    return daemonset(ctx, STATE, PLUGIN, pod, labels=_labels(PLUGIN), selector={"app": PLUGIN})


def controller_deployment(ctx: DRACtx) -> Manifest:
    draft = ctx.spec.draDriver
    image = driver_image(ctx)
    settings = draft.computeDomains.controller if draft.computeDomains else None
    main = container(
        "compute-domain",
        command=["compute-domain-controller", "-v", "$(LOG_VERBOSITY)"],
        image=image,
        env_vars=[
            env("HTTP_ENDPOINT", ":8080"),
            env("METRICS_PATH", "/metrics"),
            env("PPROF_PATH", ""),
            env("LOG_VERBOSITY", "4"),
            env("LOG_VERBOSITY_CD_DAEMON", "4"),
            POD_NAME,
            NAMESPACE,
            env("IMAGE_NAME", image),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("LEADER_ELECTION_ENABLED", "false"),
            env("LEADER_ELECTION_LEASE_LOCK_NAME", CONTROLLER),
            env("LEADER_ELECTION_LEASE_LOCK_NAMESPACE", ctx.ns),
            env("LEADER_ELECTION_LEASE_DURATION", "15s"),
            env("LEADER_ELECTION_RENEW_DEADLINE", "10s"),
            env("LEADER_ELECTION_RETRY_PERIOD", "2s"),
            *_feature_gates(ctx),
        ],
    )
    main["imagePullPolicy"] = pull_policy(draft.imagePullPolicy)
    # ours: the controller writes no file (cmd/compute-domain-controller at 22407113 logs to stderr and
    # opens none for writing) and needs no root: it talks to the apiserver and serves metrics on :8080;
    # the image (distroless) has its binaries world-executable and 65532 as its non-root user
    main["securityContext"] = {
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
    }
    env_upsert(main, settings.env if settings else None)
    limits = requirements(settings.resources if settings else None)
    if limits:
        main["resources"] = limits
    daemonsets = ctx.daemonsets
    tolerations = [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node-role.kubernetes.io/master", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        *(t.dump() for t in daemonsets.tolerations or []),
    ]
    labels = _labels(CONTROLLER)
    pod: dict[str, Any] = {
        "serviceAccountName": CONTROLLER,
        "priorityClassName": daemonsets.priorityClassName or "system-node-critical",
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                            ]
                        },
                    }
                ]
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": CONTROLLER}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            },
        },
        "tolerations": tolerations,
        "containers": [main],
    }
    pull_secrets(pod, draft.imagePullSecrets)
    deployment = obj("apps/v1", "Deployment", CONTROLLER, STATE, ctx.ns)
    deployment["metadata"]["labels"].update(labels)
    deployment["spec"] = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": CONTROLLER}},
        "template": {"metadata": {"labels": dict(deployment["metadata"]["labels"])}, "spec": pod},
    }
    return deployment


def render(ctx: DRACtx) -> list[Manifest]:
    out = driver_rbac(ctx, STATE, PLUGIN_ACCOUNT, CONTROLLER, _labels)
    out += device_classes(ctx, STATE)
    out.append(plugin_daemonset(ctx))
    if ctx.spec.draDriver.compute_domains_on():
        out.append(controller_deployment(ctx))
    out += slice_policy(ctx, STATE, PLUGIN_ACCOUNT)
    return out
