"""The cuda and plugin validations: node GPU capacity and the validation workload pods (manifests are pure)."""

from __future__ import annotations

from typing import Any

from gpu_operator.node.validate.base import Context, Outcome, ValidationFailed, ValidationResult
from gpu_operator.node.validate.config import STATUS_FILES, ValidatorConfig
from gpu_operator.vocabulary import CUDA_WORKLOAD_ENV

CUDA_APP = "nvidia-cuda-validator"
PLUGIN_APP = "nvidia-device-plugin-validator"
DEFAULT_WORKLOAD_COMMAND = ("vectorAdd",)
# CUDA_WORKLOAD=driver-api: our CUDA driver-API check, in the validator's own image
DRIVER_API_COMMAND = ("gpu-operator", "node", "cuda-check")
# The workload's init container, named as NVIDIA's validator names it: the CUDA pod's CDI
# annotation addresses it by this name.
INIT_NAMES = {CUDA_APP: "cuda-validation", PLUGIN_APP: "plugin-validation"}
# With CDI, the runtime gives the CUDA sample every GPU and the management devices by this
# annotation (the toolkit's nvidia.cdi.k8s.io/ prefix, per container), as NVIDIA's validator asks.
CUDA_CDI_ANNOTATION = (f"nvidia.cdi.k8s.io/container.{INIT_NAMES[CUDA_APP]}", "management.nvidia.com/gpu=all")


def pick_gpu_resource(allocatable: dict[str, str], override: str = "") -> str | None:
    """The GPU resource a plugin workload should ask for: MIG slices first, then whole GPUs."""

    def count(name: str) -> int:
        try:
            return int(allocatable.get(name, "0"))
        except ValueError:
            return 0

    if override:
        return override if count(override) >= 1 else None
    mig = sorted(n for n in allocatable if n.startswith("nvidia.com/mig-") and count(n) >= 1)
    if mig:
        return mig[0]
    gpus = sorted(n for n in allocatable if n.startswith("nvidia.com/gpu") and count(n) >= 1)
    return gpus[0] if gpus else None


def workload_pod(
    app: str,
    *,
    node_name: str,
    namespace: str,
    image: str,
    template: dict[str, Any],
    runtime_class: str = "",
    pull_secrets: tuple[str, ...] = (),
    pull_policy: str = "",
    gpu_resource: str | None = None,
    command: tuple[str, ...] = DEFAULT_WORKLOAD_COMMAND,
    image_env: str = "CUDA_VALIDATOR_IMAGE",
) -> dict[str, Any]:
    """A validation pod pinned to this node, owned like the validator pod, tolerating what it tolerates.
    `image_env` is the variable `image` came from (named when it is empty)."""
    if not image:
        raise ValidationFailed(f"{app}: no workload image: set {image_env} (an image with {command[0]})")
    if not node_name:
        raise ValidationFailed(f"{app}: NODE_NAME is not set; give it from the downward API (spec.nodeName)")
    init: dict[str, Any] = {
        "name": INIT_NAMES[app],
        "image": image,
        "command": list(command),
        "securityContext": {"allowPrivilegeEscalation": False},
        # a failed sample's last log lines (its CUDA error) become the termination message, which
        # the validator's failure reason quotes
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    main: dict[str, Any] = {
        "name": app,
        "image": image,
        "command": ["sh", "-c", f"echo {app} workload succeeded"],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
    }
    if gpu_resource:
        # the device plugin's Allocate answer tells the runtime which GPU to inject
        init["resources"] = {"limits": {gpu_resource: "1"}}
    else:
        # No device plugin involved: ask the NVIDIA runtime for every GPU of the node, as NVIDIA's
        # validator does; its image sets NVIDIA_VISIBLE_DEVICES=void, so without this the toolkit
        # injects no GPU and vectorAdd cannot run.
        init["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        init["securityContext"] = {"privileged": True}
        main["securityContext"] = {"privileged": True, "readOnlyRootFilesystem": True}
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "restartPolicy": "Never",
        "tolerations": template.get("tolerations") or [],
        "initContainers": [init],
        "containers": [main],
    }
    if pull_policy:
        for container in spec["initContainers"] + spec["containers"]:
            container["imagePullPolicy"] = pull_policy
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    if template.get("serviceAccountName"):
        spec["serviceAccountName"] = template["serviceAccountName"]
    metadata: dict[str, Any] = {
        "generateName": f"{app}-",
        "namespace": namespace,
        "labels": {"app": app, "app.kubernetes.io/part-of": "gpu-operator"},
    }
    if app == CUDA_APP:
        metadata["annotations"] = dict([CUDA_CDI_ANNOTATION])
    if template.get("ownerReferences"):
        metadata["ownerReferences"] = template["ownerReferences"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _needs_kube(ctx: Context, component: str) -> Any:
    if ctx.kube is None:
        raise ValidationFailed(
            f"{component}: needs the Kubernetes API (set NODE_NAME and run in-cluster or with KUBECONFIG), "
            "or set WITH_WORKLOAD=false to skip the workload pod"
        )
    return ctx.kube


def _workload(cfg: ValidatorConfig) -> tuple[str, tuple[str, ...], str, str]:
    """CUDA_WORKLOAD's image, command, the variable naming the image, and what a CUDA error asks for."""
    if cfg.cuda_workload == "driver-api":
        return (
            cfg.validator_image,
            DRIVER_API_COMMAND,
            "VALIDATOR_IMAGE",
            "the pod's last line names the CUDA error and a likely fix (`gpu-operator node cuda-check`)",
        )
    return (
        cfg.cuda_image,
        DEFAULT_WORKLOAD_COMMAND,
        "CUDA_VALIDATOR_IMAGE",
        "a driver new enough for the workload image (or CUDA_WORKLOAD=driver-api: no CUDA image)",
    )


def _run_workload(ctx: Context, component: str, app: str, gpu_resource: str | None) -> None:
    kube = _needs_kube(ctx, component)
    cfg = ctx.config
    image, command, image_env, cuda_fix = _workload(cfg)
    manifest = workload_pod(
        app,
        node_name=cfg.node_name,
        namespace=cfg.namespace or "gpu-operator",
        image=image,
        template=kube.validator_pod_template(),
        runtime_class=cfg.runtime_class,
        pull_secrets=cfg.image_pull_secrets,
        pull_policy=cfg.image_pull_policy,
        gpu_resource=gpu_resource,
        command=command,
        image_env=image_env,
    )
    budget = cfg.budgets[component]
    outcome = kube.run_pod(manifest, budget)
    if not outcome.succeeded:
        raise ValidationFailed(
            f"{component}: the {app} pod on node {cfg.node_name} ended {outcome.phase} within {budget:.0f}s: "
            f"{outcome.detail or 'no detail'}. Likely fix: `kubectl -n {manifest['metadata']['namespace']} describe pod "
            f"-l app={app}`; an image pull error needs {image_env}/pull secrets, a CUDA error {cuda_fix}"
        )


def validate_cuda(ctx: Context) -> ValidationResult:
    ctx.status.remove(STATUS_FILES["cuda"])
    if ctx.config.with_workload:
        _run_workload(ctx, "cuda", CUDA_APP, None)
        message = f"CUDA workload pod succeeded ({CUDA_WORKLOAD_ENV}={ctx.config.cuda_workload})"
    else:
        message = "WITH_WORKLOAD=false: no workload pod run"
    return ValidationResult("cuda", Outcome.PASSED, message, [ctx.status.write(STATUS_FILES["cuda"])])


def validate_plugin(ctx: Context) -> ValidationResult:
    ctx.status.remove(STATUS_FILES["plugin"])
    kube = _needs_kube(ctx, "plugin")
    found: list[str] = []

    def registered() -> str | None:
        resource = pick_gpu_resource(kube.node_allocatable(), ctx.config.resource_name)
        if resource:
            found.append(resource)
            return None
        return "node allocatable has no nvidia.com/gpu* or nvidia.com/mig-* resource"

    ctx.wait(
        registered,
        component="plugin",
        what="the device plugin to register GPUs with the kubelet",
        where=f"node {ctx.config.node_name} status.allocatable",
        fix="check the nvidia-device-plugin-daemonset pod logs on this node (it waits for toolkit-ready)",
        always=True,
    )
    if ctx.config.with_workload:
        _run_workload(ctx, "plugin", PLUGIN_APP, found[-1])
    return ValidationResult(
        "plugin", Outcome.PASSED, f"{found[-1]} is allocatable", [ctx.status.write(STATUS_FILES["plugin"])]
    )
