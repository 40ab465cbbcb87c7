"""GPUCluster nvidia.com/v1alpha1: the cluster's Dynamic Resource Allocation stack (NVIDIA's DRA
driver for GPUs and IMEX compute domains, DCGM and its exporter for that stack, DRA validation),
with the schema, defaults and status of NVIDIA's v26.7.0 CRD. One per cluster, named
`gpu-cluster` (the apiserver refuses any other name). It manages no driver and no device plugin:
the GPU driver is the host's or an NVIDIADriver's.

Unknown fields are kept and reported like ClusterPolicy's (see gpu_operator.api.common).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpu_operator.api.checks import AbsolutePath
from gpu_operator.api.clusterpolicy import DaemonsetsSpec, DCGMExporterSpec, DCGMSpec
from gpu_operator.api.common import (
    Condition,
    EnvVar,
    ImageFields,
    Model,
    ObjectMeta,
    ResourceRequirements,
    unknown_field_warnings,
)
from gpu_operator.api.crdrow import CRDRow

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "GPUCluster"
PLURAL = "gpuclusters"
SHORT_NAMES = ["gc"]
SINGLETON = "gpu-cluster"
SINGLETON_RULE = {
    "rule": f"self.metadata.name == '{SINGLETON}'",
    "message": f"GPUCluster is a singleton, metadata.name must be '{SINGLETON}'",
}
# Healthcheck ports of the kubelet plugin's containers when none is given.
GPUS_HEALTHCHECK_PORT = 51516
COMPUTE_DOMAINS_HEALTHCHECK_PORT = 51515
DRA_DRIVER_IMAGE_ENV = "DRA_DRIVER_IMAGE"

PluginPort = Annotated[int, Field(ge=1, le=65535)]


class HealthcheckSpec(Model):
    enabled: bool = True
    port: PluginPort | None = None

    def resolved_port(self, default: int) -> int | None:
        """The port the probes use; None when health checks are off (no probes rendered)."""
        return None if not self.enabled else (self.port or default)


class KubeletPluginSpec(Model):
    env: list[EnvVar] | None = None
    resources: ResourceRequirements | None = None
    healthcheck: HealthcheckSpec | None = None


class ControllerSpec(Model):
    env: list[EnvVar] | None = None
    resources: ResourceRequirements | None = None


class GPUsSpec(Model):
    """The kubelet plugin's `gpus` container: always deployed (no switch)."""

    kubeletPlugin: KubeletPluginSpec | None = None


class ComputeDomainsSpec(Model):
    """IMEX compute domains: the plugin's `compute-domains` container, the controller Deployment,
    their RBAC and DeviceClasses."""

    enabled: bool = True
    controller: ControllerSpec | None = None
    kubeletPlugin: KubeletPluginSpec | None = None


class DRADriverSpec(ImageFields):
    """The DRA driver image (repository/image:version, or @version for a sha256: digest), its pull
    settings, feature gates and the two parts of NVIDIA's DRA driver."""

    image: Annotated[str, Field(pattern=r"^[a-zA-Z0-9\-]+$")] | None = None
    # rendered as the env FEATURE_GATES=K=true,K2=false (keys sorted)
    featureGates: dict[str, bool] | None = None
    gpus: GPUsSpec | None = None
    computeDomains: ComputeDomainsSpec | None = None

    def compute_domains_on(self) -> bool:
        return self.computeDomains is None or self.computeDomains.enabled


class GPUClusterHostPaths(Model):
    """No rootFS: this stack's host root is always /."""

    driverInstallDir: AbsolutePath | None = None
    kubeletRootDir: AbsolutePath = "/var/lib/kubelet"


class GPUClusterSpec(Model):
    draDriver: DRADriverSpec
    # standalone DCGM host engine: off unless `enabled: true` (nil is off for this stack)
    dcgm: DCGMSpec | None = None
    # rendered when the block is present and not disabled
    dcgmExporter: DCGMExporterSpec | None = None
    hostPaths: GPUClusterHostPaths | None = None
    daemonsets: DaemonsetsSpec | None = None

    def dcgm_on(self) -> bool:
        return self.dcgm is not None and self.dcgm.enabled is True

    def dcgm_exporter_on(self) -> bool:
        return self.dcgmExporter is not None and self.dcgmExporter.enabled is not False


class GPUClusterStatus(Model):
    state: Literal["ready", "notReady", "disabled"]
    namespace: str | None = None
    conditions: list[Condition] | None = None


class GPUCluster(Model):
    apiVersion: Literal["nvidia.com/v1alpha1"] = "nvidia.com/v1alpha1"
    kind: Literal["GPUCluster"] = "GPUCluster"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUClusterSpec | None = None
    status: GPUClusterStatus | None = None

    def warnings(self) -> list[str]:
        return unknown_field_warnings(self, KIND, self.metadata.name)


CRD = CRDRow(GPUClusterSpec, GPUClusterStatus, rules=(SINGLETON_RULE,))  # its CRD file: api/crdgen.py
