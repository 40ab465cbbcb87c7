"""state-dra-validation: proof that DRA hands out this node's GPUs. A pod per GPU node claims one
gpu.nvidia.com device (admin access, so it never takes a GPU from a workload); its init container
lists what it got (nvidia-smi, injected through CDI by the DRA driver) and the pod stays Running as the
node's "validated" signal (label app=nvidia-operator-validator, which the upgrade controller waits
for). A node whose GPUs are all passed through to VMs leaves it Pending."""

from __future__ import annotations

from typing import Any

from gpu_operator.render.dra.common import DRACtx, claim_on, claim_template, daemonset
from gpu_operator.render.dra.driver import validator_image
from gpu_operator.render.objects import container, obj
from gpu_operator.render.operand import scc
from gpu_operator.render.result import Manifest
from gpu_operator.vocabulary import GPU_PRESENT, deploy_label

STATE = "state-dra-validation"
NAME = "nvidia-dra-validator"
TEMPLATE = "nvidia-dra-validator-gpu"
CLAIM = "validation-gpu"


def render(ctx: DRACtx) -> list[Manifest]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": NAME}
    account = obj("v1", "ServiceAccount", NAME, STATE, ctx.ns)
    account["metadata"]["labels"].update(labels)
    image = validator_image(ctx)
    check = container("gpu-validation", command=["sh", "-c", "nvidia-smi -L"], image=image)
    main = container(NAME, command=["sh", "-c", "echo all validations are successful; "
                                                "while true; do sleep 86400; done"], image=image)
    pod: dict[str, Any] = {
        "serviceAccountName": NAME,
        "nodeSelector": {deploy_label("dra-validator"): "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_PRESENT, "operator": "In", "values": ["true"]}]}]}}},
        "initContainers": [check],
        "containers": [main],
    }
    claim_on(pod, check, CLAIM, TEMPLATE)
    ds = daemonset(ctx, STATE, NAME, pod, labels={"app": NAME, **labels},
                   selector={"app.kubernetes.io/name": NAME},
                   template_labels={"app": "nvidia-operator-validator"})
    ds["spec"]["template"]["spec"]["priorityClassName"] = "system-node-critical"  # fixed for this pod
    out = [account, claim_template(ctx, STATE, TEMPLATE, CLAIM, all_devices=False)]
    if ctx.facts.openshift:
        out.append(scc(NAME, STATE, [f"system:serviceaccount:{ctx.ns}:{NAME}"], host_network=False))
    return [*out, ds]
