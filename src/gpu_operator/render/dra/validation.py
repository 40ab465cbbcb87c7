"""state-dra-validation: proof that DRA hands out this node's GPUs. A pod per GPU node claims one
gpu.nvidia.com device (admin access, so it never takes a GPU from a workload); its init container
lists what it got (nvidia-smi, injected through CDI by the DRA driver) and the pod stays Running as the
node's "validated" signal (label app=nvidia-operator-validator, which the upgrade controller waits
for). A node whose GPUs are all passed through to VMs leaves it Pending.

Ours: the GPU health agent runs beside it (container gpu-health, the same container as the
ClusterPolicy's operator-validator DaemonSet carries: render/states/operator_validation.py). It
expects no validation status file: the pod's init container proved the node's GPU is handed out
before the agent starts, so its report says validated from the start (docs/health.md, DRA)."""

from __future__ import annotations

import copy
from typing import Any

from gpu_operator.render.dra.common import DRACtx, claim_on, claim_template, daemonset
from gpu_operator.render.dra.driver import validator_image
from gpu_operator.render.objects import container, obj, upsert_env
from gpu_operator.render.operand import grant, rule, scc
from gpu_operator.render.result import Manifest
from gpu_operator.render.states._common import HOST_ROOT
from gpu_operator.render.states.operator_validation import HOST_RUN, health_container
from gpu_operator.vocabulary import GPU_PRESENT, HEALTH_NO_VALIDATIONS, deploy_label

STATE = "state-dra-validation"
NAME = "nvidia-dra-validator"
TEMPLATE = "nvidia-dra-validator-gpu"
CLAIM = "validation-gpu"


def render(ctx: DRACtx) -> list[Manifest]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": NAME}
    account = obj("v1", "ServiceAccount", NAME, STATE, ctx.ns)
    account["metadata"]["labels"].update(labels)
    image = validator_image(ctx)
    # neither writes a file: read-only root filesystems
    check = container(
        "gpu-validation",
        command=["sh", "-c", "nvidia-smi -L"],
        image=image,
        securityContext={"readOnlyRootFilesystem": True},
    )
    main = container(
        NAME,
        command=["sh", "-c", "echo all validations are successful; while true; do sleep 86400; done"],
        image=image,
        securityContext={"readOnlyRootFilesystem": True},
    )
    health = health_container()
    health["image"], health["imagePullPolicy"] = main["image"], main["imagePullPolicy"]
    upsert_env(
        health, "HEALTH_VALIDATIONS", HEALTH_NO_VALIDATIONS
    )  # no status files here: the init container checked
    pod: dict[str, Any] = {
        "serviceAccountName": NAME,
        "nodeSelector": {deploy_label("dra-validator"): "true"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": GPU_PRESENT, "operator": "In", "values": ["true"]}]}
                    ]
                }
            }
        },
        "initContainers": [check],
        "containers": [main, health],
        "volumes": [copy.deepcopy(HOST_ROOT), copy.deepcopy(HOST_RUN)],
    }
    claim_on(pod, check, CLAIM, TEMPLATE)
    ds = daemonset(
        ctx,
        STATE,
        NAME,
        pod,
        labels={"app": NAME, **labels},
        selector={"app.kubernetes.io/name": NAME},
        template_labels={"app": "nvidia-operator-validator"},
    )
    ds["spec"]["template"]["spec"]["priorityClassName"] = "system-node-critical"  # fixed for this pod
    # the health agent patches its own Node's report annotation and watches its Node (requests)
    nodes = grant(
        "ClusterRole", NAME, STATE, ctx.ns, [rule([""], ["nodes"], ["get", "list", "watch", "patch"])], NAME
    )
    out = [account, *nodes, claim_template(ctx, STATE, TEMPLATE, CLAIM, all_devices=False)]
    if ctx.facts.openshift:
        out.append(scc(NAME, STATE, [f"system:serviceaccount:{ctx.ns}:{NAME}"], host_network=False))
    return [*out, ds]
