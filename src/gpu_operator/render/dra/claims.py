"""The cluster-wide objects of state-dra-driver through which its devices are claimed and published:
the DeviceClasses (GPUs, MIG devices, passthrough GPUs, compute-domain daemons and channels) and the
admission policy that keeps each kubelet plugin to its own node's ResourceSlices."""

from __future__ import annotations

from gpu_operator.render.dra.common import COMPUTE_DOMAIN_DRIVER, GPU_DRIVER, DRACtx, device_class
from gpu_operator.render.objects import obj
from gpu_operator.render.result import Manifest

POLICY = "resourceslices-policy-nvidia-dra-driver"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def slice_policy(ctx: DRACtx, state: str, account: str) -> list[Manifest]:
    """The kubelet plugin's ServiceAccount may write only ResourceSlices of the node its pod runs on
    (the node name the apiserver puts in a node-bound token), or slices for all/selected nodes."""
    this = '(request.operation == "DELETE" ? oldObject : object).spec'
    policy = obj(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        POLICY,
        state,
        None,
        spec={
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1", "v1beta1", "v1beta2"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": ["resourceslices"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "isRestrictedUser",
                    "expression": f'request.userInfo.username == "system:serviceaccount:{ctx.ns}:{account}"',
                }
            ],
            "variables": [
                {
                    "name": "userNodeName",
                    "expression": f"request.userInfo.extra[?'{NODE_NAME_EXTRA}'][0].orValue('')",
                },
                {"name": "objectNodeName", "expression": f'{this}.?nodeName.orValue("")'},
                {"name": "nodeSelectorValue", "expression": f"{this}.?nodeSelector.orValue(null)"},
                {"name": "allNodesValue", "expression": f"{this}.?allNodes.orValue(false)"},
            ],
            "validations": [
                {
                    "expression": 'variables.userNodeName != ""',
                    "message": "the DRA kubelet plugin's ServiceAccount has no node in its token: it must run in a pod "
                    "on a node, with ServiceAccountTokenPodNodeInfo enabled",
                },
                {
                    "expression": "variables.userNodeName == variables.objectNodeName || variables.allNodesValue == true "
                    "|| variables.nodeSelectorValue != null",
                    "messageExpression": '"the DRA kubelet plugin on node \'" + variables.userNodeName + '
                    '"\' may not write ResourceSlices of other nodes"',
                },
            ],
        },
    )
    binding = obj(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        POLICY,
        state,
        None,
        spec={"policyName": POLICY, "validationActions": ["Deny"]},
    )
    return [policy, binding]


def device_classes(ctx: DRACtx, state: str) -> list[Manifest]:
    out = [
        device_class(ctx, state, GPU_DRIVER, GPU_DRIVER, "gpu"),
        device_class(ctx, state, "mig.nvidia.com", GPU_DRIVER, "mig"),
    ]
    if ctx.spec.draDriver.compute_domains_on():
        out += [
            device_class(ctx, state, "compute-domain-daemon.nvidia.com", COMPUTE_DOMAIN_DRIVER, "daemon"),
            device_class(
                ctx,
                state,
                "compute-domain-default-channel.nvidia.com",
                COMPUTE_DOMAIN_DRIVER,
                "channel",
                "id == 0",
            ),
        ]
    # passthrough GPUs (vfio-pci) are a device type of their own, published with PassthroughSupport
    out.append(device_class(ctx, state, "vfio.gpu.nvidia.com", GPU_DRIVER, "vfio"))
    return out
