"""What the four GPUCluster states share: the render context, the resource.k8s.io shapes (DeviceClass,
ResourceClaimTemplate) for the version the apiserver serves, and the DaemonSet settings from
`spec.daemonsets`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.clusterpolicy import DaemonsetsSpec
from gpu_operator.api.gpucluster import GPUCluster, GPUClusterSpec
from gpu_operator.render.objects import obj
from gpu_operator.render.result import Manifest, RenderError
from gpu_operator.render.transforms.daemonset import pod_wide

# Discovery's order of preference among the versions that serve DeviceClass.
RESOURCE_API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")
DRIVER_ROOT = "/run/nvidia/driver"
GPU_DRIVER = "gpu.nvidia.com"
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"


class DRANotServed(RenderError):
    """The apiserver serves no resource.k8s.io version with DeviceClass: nothing of the stack can be
    applied."""

    def __init__(self) -> None:
        super().__init__(
            "resource.k8s.io",
            "the apiserver serves no resource.k8s.io version with DeviceClass "
            f"(looked for {', '.join(v.split('/')[1] for v in RESOURCE_API_VERSIONS)}): enable "
            "Dynamic Resource Allocation on the API server and the kubelets (Kubernetes 1.34 or "
            "newer serves resource.k8s.io/v1 by default)",
        )


@dataclass(frozen=True)
class DRAFacts:
    """What the GPUCluster renderer knows about the cluster."""

    namespace: str = "gpu-operator"
    # The resource.k8s.io group-version discovery found serving DeviceClass; None: DRA is not served.
    resource_api: str | None = RESOURCE_API_VERSIONS[0]
    openshift: bool = False
    operator_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DRACtx:
    cluster: GPUCluster
    facts: DRAFacts

    @property
    def spec(self) -> GPUClusterSpec:
        assert self.cluster.spec is not None  # render_gpucluster checks it
        return self.cluster.spec

    @property
    def ns(self) -> str:
        return self.facts.namespace

    @property
    def resource_api(self) -> str:
        if self.facts.resource_api is None:
            raise DRANotServed()
        return self.facts.resource_api

    @property
    def daemonsets(self) -> DaemonsetsSpec:
        return self.spec.daemonsets or DaemonsetsSpec()

    @property
    def feature_gates(self) -> dict[str, bool]:
        return dict(self.spec.draDriver.featureGates or {})

    def gate_on(self, name: str) -> bool:
        return self.feature_gates.get(name) is True

    def driver_root(self) -> str:
        paths = self.spec.hostPaths
        return (paths.driverInstallDir if paths else None) or DRIVER_ROOT

    def kubelet_root(self) -> str:
        paths = self.spec.hostPaths
        return (paths.kubeletRootDir if paths else None) or "/var/lib/kubelet"


def device_class(
    ctx: DRACtx, state: str, name: str, driver: str, device_type: str, extra: str = ""
) -> Manifest:
    """A DeviceClass selecting one type of device a DRA driver publishes (a CEL selector)."""
    attribute = f"device.attributes['{driver}']"
    expression = f"device.driver == '{driver}' && {attribute}.type == '{device_type}'"
    if extra:
        expression += f" && {attribute}.{extra}"
    return obj(
        ctx.resource_api,
        "DeviceClass",
        name,
        state,
        None,
        spec={"selectors": [{"cel": {"expression": expression}}]},
    )


def claim_template(ctx: DRACtx, state: str, name: str, request: str, *, all_devices: bool) -> Manifest:
    """A ResourceClaimTemplate asking, with admin access, for one device of class gpu.nvidia.com or for
    all of them. resource.k8s.io/v1beta1 puts the request's fields on the request itself; later
    versions nest them under `exactly`."""
    wanted: dict[str, Any] = {"deviceClassName": GPU_DRIVER, "adminAccess": True}
    wanted.update({"allocationMode": "All"} if all_devices else {"allocationMode": "ExactCount", "count": 1})
    entry = (
        {"name": request, **wanted}
        if ctx.resource_api.endswith("/v1beta1")
        else {"name": request, "exactly": wanted}
    )
    return obj(
        ctx.resource_api,
        "ResourceClaimTemplate",
        name,
        state,
        ctx.ns,
        spec={"spec": {"devices": {"requests": [entry]}}},
    )


def daemonset(
    ctx: DRACtx,
    state: str,
    name: str,
    pod: dict[str, Any],
    *,
    labels: dict[str, str],
    selector: dict[str, str],
    template_labels: dict[str, str] | None = None,
    strategy: dict[str, Any] | None = None,
) -> Manifest:
    """A DaemonSet of the DRA stack: `spec.daemonsets` labels, annotations, priority class and
    tolerations (its update strategy does not apply: the stack's DaemonSets roll all at once)."""
    ds = obj("apps/v1", "DaemonSet", name, state, ctx.ns)
    ds["metadata"]["labels"].update(labels)
    pod_labels = {**ds["metadata"]["labels"], **(template_labels or {})}
    ds["spec"] = {
        "selector": {"matchLabels": selector},
        "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        "updateStrategy": strategy or {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
    }
    pod_wide(ds, ctx.daemonsets)
    return ds


def claim_on(pod: dict[str, Any], ctr: dict[str, Any], claim: str, template: str) -> None:
    """The pod gets a claim from `template`; `ctr` uses it."""
    pod.setdefault("resourceClaims", []).append({"name": claim, "resourceClaimTemplateName": template})
    ctr.setdefault("resources", {}).setdefault("claims", []).append({"name": claim})
