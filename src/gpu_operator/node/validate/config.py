"""Validator settings from the environment (upstream's names where they exist) and the component table.

The environment is the validator's contract with the pods that run it (upstream's
`nvidia-validator` reads the same names): COMPONENT, WITH_WAIT, WITH_WORKLOAD, NODE_NAME,
OPERATOR_NAMESPACE, OUTPUT_DIR, MIG_STRATEGY, METRICS_PORT, ... One pydantic model holds them;
each field's alias is its variable's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpu_operator import vocabulary

COMPONENTS = (
    "driver",
    "toolkit",
    "cuda",
    "plugin",
    "vfio-pci",
    "vgpu-manager",
    "vgpu-devices",
    "cc-manager",
    "mofed",
    "nvidia-fs",
    "gdrcopy",
    "nvidia-peermem",
)
# Status file each component creates on success (upstream names, Appendix A).
# COMPONENT=metrics is not a validation: it serves the status files as Prometheus metrics.
METRICS = "metrics"
STATUS_FILES = {
    "driver": "driver-ready",
    "toolkit": "toolkit-ready",
    "cuda": "cuda-ready",
    "plugin": "plugin-ready",
    "vfio-pci": "vfio-pci-ready",
    "vgpu-manager": "vgpu-manager-ready",
    "vgpu-devices": "vgpu-devices-ready",
    "cc-manager": "cc-manager-ready",
    "mofed": "mofed-ready",
    "nvidia-fs": "nvidia-fs-ready",
    "gdrcopy": "gdrcopy-ready",
    "nvidia-peermem": "nvidia-peermem-ready",
}
HOST_VGPU_MANAGER_FILE = "host-vgpu-manager-ready"
WORKLOAD_TYPE_FILE = "workload-type"
DRIVER_CTR_READY = ".driver-ctr-ready"
CC_MANAGER_CTR_READY = ".cc-manager-ctr-ready"
# How long each component may wait before it gives up with a named reason (seconds). Upstream's
# workload pods get 60x5 s and the plugin's capacity check 30x5 s; the rest waited forever there.
DEFAULT_BUDGETS = {
    "driver": 900.0,
    "toolkit": 300.0,
    "cuda": 300.0,
    "plugin": 150.0,
    "vfio-pci": 300.0,
    "vgpu-manager": 300.0,
    "vgpu-devices": 300.0,
    "cc-manager": 300.0,
    "mofed": 600.0,
    "nvidia-fs": 300.0,
    "gdrcopy": 300.0,
    "nvidia-peermem": 300.0,
}


class ValidatorConfigError(ValueError):
    """An environment variable has a value we cannot use; the message names it and the accepted values."""


def _env_key(component: str) -> str:
    return component.upper().replace("-", "_")


def _csv(value: Any) -> Any:
    return tuple(p.strip() for p in value.split(",") if p.strip()) if isinstance(value, str) else value


def _path_list(value: Any) -> Any:
    return tuple(p for p in value.split(":") if p) if isinstance(value, str) else value


FloatSeconds = Annotated[float, Field(ge=0)]
CsvList = Annotated[tuple[str, ...], BeforeValidator(_csv)]
Workload = vocabulary.WorkloadConfig
MigStrategy = Literal["none", "single", "mixed"]
# What each env variable accepts, for error messages that name the fix.
_EXPECTED = {
    "bool_parsing": "expected true or false",
    "float_parsing": "expected a number of seconds",
    "int_parsing": "expected a whole number",
    "greater_than_equal": "must not be negative",
}


class ValidatorConfig(BaseModel):
    """The validator's environment. Unset and empty variables take the defaults below."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    component: str = Field("", alias="COMPONENT")
    node_name: str = Field("", alias="NODE_NAME")
    namespace: str = Field("", alias="OPERATOR_NAMESPACE")
    with_wait: bool = Field(False, alias="WITH_WAIT")
    with_workload: bool = Field(True, alias="WITH_WORKLOAD")
    cleanup_all: bool = Field(False, alias="CLEANUP_ALL")
    sleep_interval: FloatSeconds = Field(5.0, alias="SLEEP_INTERVAL_SECONDS")
    output_dir: str = Field(vocabulary.VALIDATIONS_DIR, alias="OUTPUT_DIR")
    mig_strategy: MigStrategy = Field("single", alias="MIG_STRATEGY")
    metrics_port: int = Field(8000, alias="METRICS_PORT", ge=1, le=65535)
    default_workload: Workload = Field("vm-passthrough", alias="DEFAULT_GPU_WORKLOAD_CONFIG")
    workload_override: Literal[""] | Workload = Field("", alias="GPU_WORKLOAD_CONFIG")
    host_root: str = Field("/", alias="HOST_ROOT")
    driver_install_dir: str = Field("/run/nvidia/driver", alias="DRIVER_INSTALL_DIR")
    driver_install_dir_ctr_path: str = Field("/run/nvidia/driver", alias="DRIVER_INSTALL_DIR_CTR_PATH")
    skip_gpu_init: bool = Field(False, alias="DRIVER_VALIDATION_SKIP_GPU_INIT")
    disable_dev_char_symlinks: bool = Field(False, alias="DISABLE_DEV_CHAR_SYMLINK_CREATION")
    gpu_direct_rdma: bool = Field(False, alias="GPU_DIRECT_RDMA_ENABLED")
    cc_capable: bool | None = Field(None, alias="CC_CAPABLE")
    search_dirs: Annotated[tuple[str, ...], BeforeValidator(_path_list)] = Field(
        (), alias="DRIVER_SEARCH_PATHS"
    )
    skipped: frozenset[str] = Field(frozenset(), alias="VALIDATOR_SKIP")
    budgets: dict[str, FloatSeconds] = Field(default_factory=lambda: dict(DEFAULT_BUDGETS))
    validator_image: str = Field("", alias="VALIDATOR_IMAGE")
    cuda_image: str = Field("", alias="CUDA_VALIDATOR_IMAGE")
    # vocabulary.CUDA_WORKLOADS: what the workload pods run (vectorAdd from cuda_image, or our
    # driver-API check from validator_image)
    cuda_workload: Literal["vectorAdd", "driver-api"] = Field("vectorAdd", alias="CUDA_WORKLOAD")
    runtime_class: str = Field("", alias="VALIDATOR_RUNTIME_CLASS")
    image_pull_policy: Literal["", "Always", "IfNotPresent", "Never"] = Field(
        "", alias="VALIDATOR_IMAGE_PULL_POLICY"
    )
    image_pull_secrets: CsvList = Field((), alias="VALIDATOR_IMAGE_PULL_SECRETS")
    resource_name: str = Field("", alias="PLUGIN_RESOURCE_NAME")

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        """Empty means unset; the skip list and the per-component budgets come from several variables."""
        if not isinstance(data, Mapping):
            return data
        env = {k: v for k, v in data.items() if v != ""}
        skipped = set(_csv(env.get("VALIDATOR_SKIP", "")))
        unknown = skipped - set(COMPONENTS)
        if unknown:
            raise ValueError(
                f"VALIDATOR_SKIP names unknown component(s) {sorted(unknown)}: use {', '.join(COMPONENTS)}"
            )
        for component in COMPONENTS:
            flag = f"DISABLE_{_env_key(component)}_VALIDATION"
            if flag in env:
                env[flag] = _strict_bool(flag, env[flag])
                if env[flag]:
                    skipped.add(component)
        env["VALIDATOR_SKIP"] = frozenset(skipped)
        overall = env.get("VALIDATION_TIMEOUT_SECONDS")
        env.setdefault(
            "budgets",
            {
                c: env.get(f"{_env_key(c)}_TIMEOUT_SECONDS", overall if overall is not None else b)
                for c, b in DEFAULT_BUDGETS.items()
            },
        )
        # CUDA workload pods run the validator image unless a CUDA image is named
        env.setdefault("CUDA_VALIDATOR_IMAGE", env.get("VALIDATOR_IMAGE", ""))
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ValidatorConfig:
        try:
            return cls.model_validate(dict(env))
        except ValidationError as err:
            raise ValidatorConfigError("; ".join(_describe(e, env) for e in err.errors())) from None


def _strict_bool(name: str, raw: Any) -> bool:
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected true or false")


def _describe(error: Any, env: Mapping[str, str]) -> str:
    """`NAME='value': what is accepted`, naming the variable (or a budget's variable)."""
    loc = [str(part) for part in error.get("loc", ())]
    if not loc:
        return str(error.get("msg", "")).removeprefix("Value error, ")
    name = loc[0]
    if name == "budgets" and len(loc) > 1:
        name = f"{_env_key(loc[1])}_TIMEOUT_SECONDS"
        if name not in env:
            name = "VALIDATION_TIMEOUT_SECONDS"
    raw = env.get(name, error.get("input"))
    expected = _EXPECTED.get(error.get("type", ""))
    if expected is None:
        ctx = error.get("ctx") or {}
        expected = f"use one of {ctx['expected']}" if "expected" in ctx else str(error.get("msg", ""))
    return f"{name}={raw!r}: {expected}"
