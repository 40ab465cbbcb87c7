"""NVIDIADriver nvidia.com/v1alpha1: per-node-pool driver configuration, as upstream's CRD.

Unknown fields are kept and reported like ClusterPolicy's (see gpu_operator.api.common).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from gpu_operator.api.checks import Annotations, ImageName, Labels, ObjectName
from gpu_operator.api.common import (
    KERNEL_MODULE_TYPE_RULES,
    ComponentFields,
    Condition,
    ContainerProbeSpec,
    DriverManagerSpec,
    DriverUpgradePolicySpec,
    EnvVar,
    GPUDirectRDMASpec,
    ImageFields,
    KernelModuleType,
    Model,
    ObjectMeta,
    PodSecurityContext,
    ResourceRequirements,
    Toleration,
    misplaced_module_type,
    unknown_field_warnings,
)
from gpu_operator.api.crdrow import CRDRow

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "NVIDIADriver"
PLURAL = "nvidiadrivers"
SHORT_NAMES = ["nvd", "nvdriver", "nvdrivers"]

DriverType = Literal["gpu", "vgpu", "vgpu-host-manager"]


class SidecarDriverSpec(ImageFields):
    """GDS / GDRCopy sidecars of the driver pod."""

    enabled: bool | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None


class NameRef(Model):
    name: ObjectName | None = None


class LicensingConfig(Model):
    secretName: ObjectName | None = None
    name: ObjectName | None = None
    nlsEnabled: bool | None = None


class NVIDIADriverUpgradePolicy(DriverUpgradePolicySpec):
    """Like ClusterPolicy's, except that auto-upgrade defaults to on."""

    autoUpgrade: bool = True


class NVIDIADriverSpec(ComponentFields):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.default) && self.default) || !has(self.nodeSelector) "
                    "|| size(self.nodeSelector) == 0",
                    "message": "the default NVIDIADriver must not set nodeSelector",
                    "fieldPath": ".nodeSelector",
                },
                {
                    "rule": "!has(self.nodeSelector) || !('nvidia.com/gpu-operator.driver.owner' in self.nodeSelector)",
                    "message": "nodeSelector must not use nvidia.com/gpu-operator.driver.owner: the operator "
                    "writes that label from the nodeSelector",
                    "fieldPath": ".nodeSelector",
                },
                {
                    "rule": "!has(oldSelf.driverType) || !has(self.driverType) || self.driverType == oldSelf.driverType",
                    "message": "driverType is immutable",
                    "fieldPath": ".driverType",
                },
                {
                    "rule": "(has(self.usePrecompiled) ? self.usePrecompiled : false) == "
                    "(has(oldSelf.usePrecompiled) ? oldSelf.usePrecompiled : false)",
                    "message": "usePrecompiled is immutable",
                    "fieldPath": ".usePrecompiled",
                },
            ]
        }
    )

    default: bool = False
    driverType: DriverType = "gpu"
    usePrecompiled: bool | None = None
    useOpenKernelModules: bool | None = Field(default=None, description="Deprecated: use kernelModuleType.")
    kernelModuleType: Annotated[KernelModuleType, BeforeValidator(misplaced_module_type)] = Field(
        default="auto", json_schema_extra=KERNEL_MODULE_TYPE_RULES
    )
    startupProbe: ContainerProbeSpec | None = None
    livenessProbe: ContainerProbeSpec | None = None
    readinessProbe: ContainerProbeSpec | None = None
    rdma: GPUDirectRDMASpec | None = None
    gds: SidecarDriverSpec | None = None
    gdrcopy: SidecarDriverSpec | None = None
    image: ImageName = "nvcr.io/nvidia/driver"
    manager: DriverManagerSpec | None = None
    resources: ResourceRequirements | None = None
    repoConfig: NameRef | None = None
    certConfig: NameRef | None = None
    licensingConfig: LicensingConfig | None = None
    virtualTopologyConfig: NameRef | None = None
    kernelModuleConfig: NameRef | None = None
    secretEnv: ObjectName | None = None
    upgradePolicy: NVIDIADriverUpgradePolicy | None = None
    nodeSelector: Labels | None = None
    nodeAffinity: dict[str, Any] | None = None
    labels: Labels | None = None
    annotations: Annotations | None = None
    tolerations: list[Toleration] | None = None
    priorityClassName: ObjectName | None = None
    podSecurityContext: PodSecurityContext | None = None


class NVIDIADriverStatus(Model):
    state: Literal["ignored", "ready", "notReady", "disabled"] | None = None
    namespace: str | None = None
    conditions: list[Condition] | None = None


class NVIDIADriver(Model):
    apiVersion: Literal["nvidia.com/v1alpha1"] = "nvidia.com/v1alpha1"
    kind: Literal["NVIDIADriver"] = "NVIDIADriver"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NVIDIADriverSpec = Field(default_factory=NVIDIADriverSpec)
    status: NVIDIADriverStatus | None = None

    def warnings(self) -> list[str]:
        return unknown_field_warnings(self, "NVIDIADriver", self.metadata.name)


CRD = CRDRow(NVIDIADriverSpec, NVIDIADriverStatus, ("Status", "Default", "Age"))  # api/crdgen.py
