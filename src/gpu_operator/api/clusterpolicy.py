"""ClusterPolicy nvidia.com/v1: the operator's configuration, field for field as upstream's CRD.

Attribute names are the wire names (camelCase), so `policy.spec.devicePlugin.config.name` reads
like the YAML. Optional booleans stay ``None`` when unset and ``is_enabled()`` applies the Go
default, so an object round-trips without gaining fields. Unknown fields are kept and listed by
:meth:`ClusterPolicy.warnings` (see gpu_operator.api.common and docs/api.md).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from gpu_operator.api.checks import (
    AbsolutePath,
    Annotations,
    Labels,
    NumberOrPercent,
    ObjectName,
    Port,
)
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
    Toggle,
    Toleration,
    misplaced_module_type,
    unknown_field_warnings,
)
from gpu_operator.api.crdrow import CRDRow
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.api.monitoring import OperatorMetricsSpec, ServiceMonitorConfig
from gpu_operator.vocabulary import WorkloadConfig

GROUP = "nvidia.com"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"


class Component(Toggle, ComponentFields):
    """An operand with image fields and an on/off switch; DEFAULT_ENABLED is the Go default."""

    DEFAULT_ENABLED: ClassVar[bool] = True

    def on(self) -> bool:
        return self.is_enabled(self.DEFAULT_ENABLED)


class OffByDefault(Component):
    DEFAULT_ENABLED: ClassVar[bool] = False


class InitContainerSpec(ImageFields):
    pass


class OperatorSpec(Model):
    defaultRuntime: Literal["docker", "crio", "containerd"] | None = Field(
        default=None, description="Deprecated and ignored: the runtime is detected from the nodes."
    )
    runtimeClass: ObjectName = "nvidia"
    initContainer: InitContainerSpec | None = None
    labels: Labels | None = None
    annotations: Annotations | None = None
    metrics: OperatorMetricsSpec | None = None
    use_ocp_driver_toolkit: bool | None = None


class RollingUpdateSpec(Model):
    maxUnavailable: NumberOrPercent | None = None


class DaemonsetsSpec(Model):
    labels: Labels | None = None
    annotations: Annotations | None = None
    tolerations: list[Toleration] | None = None
    priorityClassName: ObjectName | None = None
    updateStrategy: Literal["RollingUpdate", "OnDelete"] = "RollingUpdate"
    rollingUpdate: RollingUpdateSpec | None = None
    podSecurityContext: PodSecurityContext | None = None


class ConfigMapNameSpec(Model):
    configMapName: ObjectName | None = None


class NameSpec(Model):
    name: ObjectName | None = None


class DriverLicensingConfigSpec(Model):
    configMapName: ObjectName | None = None
    secretName: ObjectName | None = None
    nlsEnabled: bool | None = None


class VirtualTopologySpec(Model):
    config: str | None = None


class DriverSpec(Component):
    useNvidiaDriverCRD: bool | None = None
    usePrecompiled: bool | None = None
    useOpenKernelModules: bool | None = Field(default=None, description="Deprecated: use kernelModuleType.")
    kernelModuleType: Annotated[KernelModuleType, BeforeValidator(misplaced_module_type)] = Field(
        default="auto", json_schema_extra=KERNEL_MODULE_TYPE_RULES
    )
    startupProbe: ContainerProbeSpec | None = None
    livenessProbe: ContainerProbeSpec | None = None
    readinessProbe: ContainerProbeSpec | None = None
    rdma: GPUDirectRDMASpec | None = None
    upgradePolicy: DriverUpgradePolicySpec | None = None
    manager: DriverManagerSpec | None = None
    repoConfig: ConfigMapNameSpec | None = None
    certConfig: NameSpec | None = None
    licensingConfig: DriverLicensingConfigSpec | None = None
    virtualTopology: VirtualTopologySpec | None = None
    kernelModuleConfig: NameSpec | None = None
    secretEnv: ObjectName | None = None
    guestNVLink: Literal["disable", "leave"] | None = Field(
        default=None,
        description="On VM guest nodes given NVLink GPUs (HGX A100/H100/H200 SXM) without their NVSwitches (NFD's "
        "cpu-cpuid.HYPERVISOR and pci-10de_<device> labels), the driver waits for a fabric no Fabric Manager brings "
        "up and CUDA fails to start. disable (default): those nodes get a driver DaemonSet of their own whose "
        "nvidia.conf is kernelModuleConfig's with NVreg_NvLinkDisable=1 added (a value the user's nvidia.conf sets "
        "wins); leave: never (NVIDIA's behaviour; for a fabric managed for the VM). Other nodes are never affected.",
    )

    def guest_nvlink_disable(self) -> bool:
        return self.guestNVLink != "leave"

    def precompiled(self) -> bool:
        return bool(self.usePrecompiled)

    def rdma_on(self) -> bool:
        return bool(self.rdma and self.rdma.enabled)

    def host_mofed(self) -> bool:
        return bool(self.rdma and self.rdma.useHostMofed)


class ToolkitSpec(Component):
    installDir: AbsolutePath = "/usr/local/nvidia"


class DevicePluginConfig(Model):
    name: ObjectName | None = None
    default: str | None = None


class MPSConfig(Model):
    root: AbsolutePath = "/run/nvidia/mps"


class DevicePluginSpec(Component):
    config: DevicePluginConfig | None = None
    mps: MPSConfig | None = None


class DCGMExporterMetricsConfig(Model):
    name: ObjectName | None = None


class DCGMExporterServiceConfig(Model):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = None
    internalTrafficPolicy: Literal["Cluster", "Local"] | None = None


class HPCJobMappingConfig(Model):
    enabled: bool | None = None
    directory: AbsolutePath | None = None


class DCGMExporterSpec(Component):
    annotations: Annotations | None = None
    config: DCGMExporterMetricsConfig | None = None
    serviceMonitor: ServiceMonitorConfig | None = None
    service: DCGMExporterServiceConfig | None = None
    hostPID: bool | None = None
    hpcJobMapping: HPCJobMappingConfig | None = None
    enablePodLabels: bool | None = None
    enablePodUID: bool | None = None
    podLabelAllowlistRegex: list[str] | None = None


class DCGMSpec(Component):
    hostPort: Port | None = None


class NodeStatusExporterSpec(OffByDefault):
    pass


class GPUFeatureDiscoverySpec(Component):
    pass


class MIGSpec(Model):
    strategy: Literal["none", "single", "mixed"] | None = None


class MIGPartedConfig(Model):
    name: ObjectName | None = None
    default: Literal["all-disabled", ""] = "all-disabled"


class MIGManagerSpec(Component):
    config: MIGPartedConfig | None = None
    gpuClientsConfig: NameSpec | None = None


class PSPSpec(Model):
    enabled: bool | None = Field(default=None, description="Deprecated and ignored.")


class PSASpec(Toggle):
    pass


class EnvOnly(Model):
    env: list[EnvVar] | None = None


class ValidatorSpec(ComponentFields):
    plugin: EnvOnly | None = None
    toolkit: EnvOnly | None = None
    driver: EnvOnly | None = None
    cuda: EnvOnly | None = None
    vfioPCI: EnvOnly | None = None
    vgpuManager: EnvOnly | None = None
    vgpuDevices: EnvOnly | None = None


class GPUDirectStorageSpec(OffByDefault):
    pass


class GDRCopySpec(OffByDefault):
    pass


class KubeVirtSpec(Model):
    """Ours (upstream has no such field): how the operator keeps KubeVirt's CR in step with the GPUs."""

    syncPermittedHostDevices: bool | None = Field(
        default=None,
        description="Keep spec.configuration.permittedHostDevices.pciHostDevices of the KubeVirt CR in step with "
        "the GPUs of vm-passthrough nodes (default true; needs sandboxWorkloads.enabled and KubeVirt's CRD).",
    )

    def sync_on(self) -> bool:
        return self.syncPermittedHostDevices is not False


class SandboxWorkloadsSpec(Toggle):
    defaultWorkload: WorkloadConfig = "container"
    mode: Literal["kubevirt", "kata"] = "kubevirt"
    kubevirt: KubeVirtSpec | None = None

    def kubevirt_sync(self) -> bool:
        """Whether the KubeVirt sync runs: sandbox on, mode kubevirt, not switched off."""
        return (
            self.is_enabled(False) and self.mode == "kubevirt" and (self.kubevirt or KubeVirtSpec()).sync_on()
        )


class VFIOManagerSpec(OffByDefault):
    driverManager: DriverManagerSpec | None = None


class SandboxDevicePluginSpec(OffByDefault):
    pass


class VGPUManagerSpec(OffByDefault):
    driverManager: DriverManagerSpec | None = None
    kernelModuleConfig: NameSpec | None = None


class VGPUDevicesConfig(Model):
    name: ObjectName | None = None
    default: str = "default"


class VGPUDeviceManagerSpec(OffByDefault):
    config: VGPUDevicesConfig | None = None


class CDIConfigSpec(Model):
    enabled: bool | None = None
    default: bool | None = Field(default=None, description="Deprecated and ignored.")
    nriPluginEnabled: bool | None = None

    def on(self) -> bool:
        return True if self.enabled is None else self.enabled

    def nri(self) -> bool:
        return bool(self.nriPluginEnabled)


class KataManagerConfig(Model):
    artifactsDir: AbsolutePath = "/opt/nvidia-gpu-operator/artifacts/runtimeclasses"
    runtimeClasses: list[dict[str, Any]] | None = None


class KataManagerSpec(OffByDefault):
    """Deprecated: upstream ignores it entirely; kept so old objects load."""

    config: KataManagerConfig | None = None


class CCManagerSpec(OffByDefault):
    defaultMode: Literal["on", "off", "devtools"] | None = None


class HostPathsSpec(Model):
    rootFS: AbsolutePath | None = None
    driverInstallDir: AbsolutePath | None = None
    kubeletRootDir: AbsolutePath = "/var/lib/kubelet"

    def root(self) -> str:
        return self.rootFS or "/"

    def driver_install_dir(self) -> str:
        return self.driverInstallDir or "/run/nvidia/driver"


class KataDevicePluginSpec(OffByDefault):
    pass


_NRI_RULE = (
    "!has(self.cdi) || !has(self.cdi.nriPluginEnabled) || !self.cdi.nriPluginEnabled || "
    "((!has(self.cdi.enabled) || self.cdi.enabled) && "
    "(!has(self.toolkit) || !has(self.toolkit.enabled) || self.toolkit.enabled))"
)
_PRECOMPILED_RULE = (
    "!has(self.driver) || !has(self.driver.usePrecompiled) || !self.driver.usePrecompiled || "
    "((!has(self.gds) || !has(self.gds.enabled) || !self.gds.enabled) && "
    "(!has(self.gdrcopy) || !has(self.gdrcopy.enabled) || !self.gdrcopy.enabled))"
)


class ClusterPolicySpec(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": _NRI_RULE,
                    "message": "cdi.nriPluginEnabled needs cdi.enabled=true and toolkit.enabled=true",
                },
                {
                    "rule": _PRECOMPILED_RULE,
                    "message": "driver.usePrecompiled cannot be combined with gds.enabled or gdrcopy.enabled",
                },
            ]
        }
    )

    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)
    driver: DriverSpec = Field(default_factory=DriverSpec)
    toolkit: ToolkitSpec = Field(default_factory=ToolkitSpec)
    devicePlugin: DevicePluginSpec = Field(default_factory=DevicePluginSpec)
    dcgmExporter: DCGMExporterSpec = Field(default_factory=DCGMExporterSpec)
    dcgm: DCGMSpec = Field(default_factory=DCGMSpec)
    nodeStatusExporter: NodeStatusExporterSpec = Field(default_factory=NodeStatusExporterSpec)
    gfd: GPUFeatureDiscoverySpec = Field(default_factory=GPUFeatureDiscoverySpec)
    mig: MIGSpec = Field(default_factory=MIGSpec)
    migManager: MIGManagerSpec = Field(default_factory=MIGManagerSpec)
    psp: PSPSpec = Field(default_factory=PSPSpec)
    psa: PSASpec = Field(default_factory=PSASpec)
    validator: ValidatorSpec = Field(default_factory=ValidatorSpec)
    gds: GPUDirectStorageSpec = Field(default_factory=GPUDirectStorageSpec)
    gdrcopy: GDRCopySpec = Field(default_factory=GDRCopySpec)
    sandboxWorkloads: SandboxWorkloadsSpec = Field(default_factory=SandboxWorkloadsSpec)
    vfioManager: VFIOManagerSpec = Field(default_factory=VFIOManagerSpec)
    sandboxDevicePlugin: SandboxDevicePluginSpec = Field(default_factory=SandboxDevicePluginSpec)
    vgpuManager: VGPUManagerSpec = Field(default_factory=VGPUManagerSpec)
    vgpuDeviceManager: VGPUDeviceManagerSpec = Field(default_factory=VGPUDeviceManagerSpec)
    cdi: CDIConfigSpec = Field(default_factory=CDIConfigSpec)
    kataManager: KataManagerSpec = Field(default_factory=KataManagerSpec)
    ccManager: CCManagerSpec = Field(default_factory=CCManagerSpec)
    hostPaths: HostPathsSpec = Field(default_factory=HostPathsSpec)
    kataSandboxDevicePlugin: KataDevicePluginSpec = Field(default_factory=KataDevicePluginSpec)
    # ours, not upstream's (api/healthpolicy.py, docs/health.md): unset keeps the defaults
    health: HealthSpec | None = None

    def sandbox_on(self) -> bool:
        return self.sandboxWorkloads.is_enabled(False)

    def default_workload(self) -> str:
        """The workload config of nodes without a valid `nvidia.com/gpu.workload.config` label."""
        if not self.sandbox_on():
            return "container"
        return self.sandboxWorkloads.defaultWorkload

    def sandbox_mode(self) -> str:
        return self.sandboxWorkloads.mode

    def driver_upgrade_policy(self) -> DriverUpgradePolicySpec | None:
        """driver.upgradePolicy where it applies: the driver enabled and no sandbox workloads."""
        return self.driver.upgradePolicy if self.driver.on() and not self.sandbox_on() else None

    def driver_auto_upgrade(self) -> bool:
        """Whether nodes get annotation nvidia.com/gpu-driver-upgrade-enabled=true."""
        policy = self.driver_upgrade_policy()
        return policy is not None and policy.autoUpgrade


ClusterPolicyState = Literal["ignored", "ready", "notReady"]


class ClusterPolicyStatus(Model):
    state: ClusterPolicyState | None = None
    namespace: str | None = None
    conditions: list[Condition] | None = None


class ClusterPolicy(Model):
    """The whole ClusterPolicy object (cluster-scoped)."""

    apiVersion: Literal["nvidia.com/v1"] = "nvidia.com/v1"
    kind: Literal["ClusterPolicy"] = "ClusterPolicy"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ClusterPolicySpec = Field(default_factory=ClusterPolicySpec)
    status: ClusterPolicyStatus | None = None

    def warnings(self) -> list[str]:
        """One line per unknown field (kept as-is, but the operator does not act on it)."""
        return unknown_field_warnings(self, "ClusterPolicy", self.metadata.name)


__all__ = [
    "CCManagerSpec",
    "CDIConfigSpec",
    "ClusterPolicy",
    "ClusterPolicySpec",
    "ClusterPolicyStatus",
    "Component",
    "DaemonsetsSpec",
    "DriverSpec",
    "HostPathsSpec",
    "ValidatorSpec",
]


CRD = CRDRow(ClusterPolicySpec, ClusterPolicyStatus)  # its CRD file: api/crdgen.py
