"""Building blocks shared by the ClusterPolicy and NVIDIADriver models (image fields, env, probes).

Unknown fields: every model keeps fields it does not know (pydantic ``extra="allow"``) so that a
ClusterPolicy written for a newer upstream release still loads and round-trips unchanged;
:func:`unknown_fields` lists them so callers can report them as warnings. Nothing is dropped
silently. (The API server itself prunes unknown fields against the CRD schema.)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from gpu_operator.api.checks import (
    EnvName,
    ImageName,
    ImageRepository,
    ImageVersion,
    IntOrPercent,
    ObjectName,
    Quantity,
    Seconds,
)

# "" is upstream's unset (Kubernetes then defaults it).
PullPolicy = Literal["Always", "IfNotPresent", "Never", ""]
KernelModuleType = Literal["auto", "open", "proprietary"]
PRECOMPILED_IS_NOT_A_MODULE_TYPE = (
    "precompiled is not a kernel module type: a precompiled driver is chosen with usePrecompiled: true "
    "(kernelModuleType stays auto, open or proprietary)"
)
RUNCOMPILED_IS_NOT_A_MODULE_TYPE = (
    "runcompiled is not a kernel module type: a driver compiled on the node at run time is what "
    "usePrecompiled: false (the default) gives; kernelModuleType picks the modules, auto, open or proprietary"
)
# Values users write for kernelModuleType that belong to another field: the message that names it.
MISPLACED_MODULE_TYPES = {
    "precompiled": PRECOMPILED_IS_NOT_A_MODULE_TYPE,
    "runcompiled": RUNCOMPILED_IS_NOT_A_MODULE_TYPE,
}


def KERNEL_MODULE_TYPE_RULES(schema: JsonDict) -> None:  # noqa: N802 (a schema hook, named as data)
    """kernelModuleType's CRD schema: the allowed values as a CEL rule instead of an enum, because
    the apiserver answers an enum miss with its own text only, and `precompiled` and `runcompiled` (a
    common mix-up) need the answer that names usePrecompiled. Any other value gets the list of allowed ones."""
    enum = schema.pop("enum", [])
    allowed = [str(v) for v in enum] if isinstance(enum, list) else []
    listed = ", ".join(f"'{v}'" for v in allowed)
    schema["x-kubernetes-validations"] = [
        {
            "rule": f"self in [{listed}]",
            "messageExpression": "".join(
                f"self == '{value}' ? '{hint}' : " for value, hint in MISPLACED_MODULE_TYPES.items()
            )
            + f"'unsupported value ' + self + ': use one of {', '.join(allowed)}'",
        }
    ]


def misplaced_module_type(value: object) -> object:
    """A before-validator for kernelModuleType: the misplaced value gets the field that does it."""
    if isinstance(value, str) and value in MISPLACED_MODULE_TYPES:
        raise ValueError(MISPLACED_MODULE_TYPES[value])
    return value


class Model(BaseModel):
    """Base of every API model: wire names as attribute names, unknown fields kept."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, validate_default=False)

    def dump(self) -> dict[str, Any]:
        """The object as plain JSON data, exactly the fields that were set (round-trips)."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)


def unknown_fields(model: BaseModel, path: str = "") -> list[str]:
    """Dotted paths of every field that no model declares (kept, but worth a warning)."""
    found: list[str] = []
    for key in sorted(model.model_extra or {}):
        found.append(f"{path}.{key}" if path else key)
    for name in type(model).model_fields:
        value = getattr(model, name)
        child = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            found.extend(unknown_fields(value, child))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found.extend(unknown_fields(item, f"{child}[{index}]"))
    return found


def unknown_field_warnings(model: BaseModel, kind: str, name: str) -> list[str]:
    """One line per unknown spec field: kept as-is, but the operator does not act on it."""
    return [
        f"unknown field {path!r} in {kind} {name!r}: kept, but ignored"
        for path in unknown_fields(model)
        if not path.startswith(("metadata.", "status."))
    ]


class EnvVar(Model):
    """A name/value pair (upstream's own type: no valueFrom)."""

    name: EnvName
    value: str = ""


class ResourceRequirements(Model):
    """Container resources; quantities as in Kubernetes (int or string)."""

    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Toleration(Model):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = None
    operator: str | None = Field(default=None, description="Exists or Equal (default Equal).")
    value: str | None = None
    effect: str | None = Field(
        default=None, description="NoSchedule, PreferNoSchedule or NoExecute; empty: all."
    )
    tolerationSeconds: int | None = None


class SELinuxOptions(Model):
    level: str | None = None
    role: str | None = None
    type: str | None = None
    user: str | None = None


class SeccompProfile(Model):
    type: str = Field(description="RuntimeDefault, Unconfined or Localhost.")
    localhostProfile: str | None = None


class AppArmorProfile(Model):
    type: str = Field(description="RuntimeDefault, Unconfined or Localhost.")
    localhostProfile: str | None = None


class Sysctl(Model):
    name: str
    value: str


class WindowsSecurityContextOptions(Model):
    gmsaCredentialSpec: str | None = None
    gmsaCredentialSpecName: str | None = None
    hostProcess: bool | None = None
    runAsUserName: str | None = None


class PodSecurityContext(Model):
    """A pod's security context (core/v1 PodSecurityContext)."""

    appArmorProfile: AppArmorProfile | None = None
    fsGroup: int | None = None
    fsGroupChangePolicy: str | None = None
    runAsGroup: int | None = None
    runAsNonRoot: bool | None = None
    runAsUser: int | None = None
    seLinuxChangePolicy: str | None = None
    seLinuxOptions: SELinuxOptions | None = None
    seccompProfile: SeccompProfile | None = None
    supplementalGroups: list[int] | None = None
    supplementalGroupsPolicy: str | None = None
    sysctls: list[Sysctl] | None = None
    windowsOptions: WindowsSecurityContextOptions | None = None


class ImageFields(Model):
    """repository/image/version as upstream resolves them, plus pull settings."""

    repository: ImageRepository | None = None
    image: ImageName | None = None
    version: ImageVersion | None = None
    imagePullPolicy: PullPolicy | None = None
    imagePullSecrets: list[ObjectName] | None = None


class ComponentFields(ImageFields):
    """The fields every operand spec has (upstream's "component common fields")."""

    resources: ResourceRequirements | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    hostNetwork: bool | None = None


class Toggle(Model):
    """A component that can be switched on and off; `enabled` unset means the Go default."""

    enabled: bool | None = None

    def is_enabled(self, default: bool) -> bool:
        return default if self.enabled is None else self.enabled


class ContainerProbeSpec(Model):
    initialDelaySeconds: Seconds | None = None
    timeoutSeconds: Seconds | None = None
    periodSeconds: Seconds | None = None
    successThreshold: Seconds | None = None
    failureThreshold: Seconds | None = None


class DriverManagerSpec(ImageFields):
    """The k8s-driver-manager init container of driver-like DaemonSets."""

    env: list[EnvVar] | None = None


class GPUDirectRDMASpec(Model):
    enabled: bool | None = None
    useHostMofed: bool | None = None


class WaitForCompletionSpec(Model):
    podSelector: str | None = None
    timeoutSeconds: int = Field(default=0, ge=0)


class PodDeletionSpec(Model):
    force: bool = False
    timeoutSeconds: int = Field(default=300, ge=0)
    deleteEmptyDir: bool = False


class DrainSpec(Model):
    enable: bool = False
    force: bool = False
    podSelector: str | None = None
    timeoutSeconds: int = Field(default=300, ge=0)
    deleteEmptyDir: bool = False


class DriverUpgradePolicySpec(Model):
    """Driver auto-upgrade policy (the k8s-operator-libs shape)."""

    autoUpgrade: bool = False
    maxParallelUpgrades: int = Field(default=1, ge=0)
    maxUnavailable: IntOrPercent = "25%"
    waitForCompletion: WaitForCompletionSpec | None = None
    podDeletion: PodDeletionSpec | None = None
    drain: DrainSpec | None = None


class Condition(Model):
    """metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str | None = None
    observedGeneration: int | None = None


class ObjectMeta(Model):
    """The parts of metadata the operator reads; everything else is kept as unknown fields."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resourceVersion: str | None = None
    creationTimestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
