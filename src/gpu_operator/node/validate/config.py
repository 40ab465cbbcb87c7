"""Validator settings from the environment (upstream's names where they exist) and the component table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
WORKLOAD_CONFIGS = ("container", "vm-passthrough", "vm-vgpu")
WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"


class ConfigError(ValueError):
    """An environment variable has a value we cannot use; the message names it and the accepted values."""


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: expected true or false")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number of seconds") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r}: must not be negative")
    return value


def _env_key(component: str) -> str:
    return component.upper().replace("-", "_")


@dataclass
class ValidatorConfig:
    node_name: str = ""
    namespace: str = ""
    with_wait: bool = False
    with_workload: bool = True
    sleep_interval: float = 5.0
    output_dir: str = "/run/nvidia/validations"
    mig_strategy: str = "single"
    default_workload: str = "vm-passthrough"
    workload_override: str = ""
    driver_install_dir: str = "/run/nvidia/driver"
    skip_gpu_init: bool = False
    disable_dev_char_symlinks: bool = False
    gpu_direct_rdma: bool = False
    cc_capable: bool | None = None
    search_dirs: tuple[str, ...] = ()
    skipped: frozenset[str] = frozenset()
    budgets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))
    validator_image: str = ""
    cuda_image: str = ""
    runtime_class: str = ""
    image_pull_policy: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    resource_name: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ValidatorConfig:
        skipped = {c.strip() for c in env.get("VALIDATOR_SKIP", "").split(",") if c.strip()}
        unknown = skipped - set(COMPONENTS)
        if unknown:
            raise ConfigError(
                f"VALIDATOR_SKIP names unknown component(s) {sorted(unknown)}: use {', '.join(COMPONENTS)}"
            )
        for component in COMPONENTS:
            if _bool(env, f"DISABLE_{_env_key(component)}_VALIDATION", False):
                skipped.add(component)
        overall = env.get("VALIDATION_TIMEOUT_SECONDS")
        budgets = {
            c: _float(
                env,
                f"{_env_key(c)}_TIMEOUT_SECONDS",
                _float(env, "VALIDATION_TIMEOUT_SECONDS", b) if overall else b,
            )
            for c, b in DEFAULT_BUDGETS.items()
        }
        workload = env.get("GPU_WORKLOAD_CONFIG", "")
        default_workload = env.get("DEFAULT_GPU_WORKLOAD_CONFIG", "") or "vm-passthrough"
        for name, value in (
            ("GPU_WORKLOAD_CONFIG", workload),
            ("DEFAULT_GPU_WORKLOAD_CONFIG", default_workload),
        ):
            if value and value not in WORKLOAD_CONFIGS:
                raise ConfigError(f"{name}={value!r}: use one of {', '.join(WORKLOAD_CONFIGS)}")
        policy = env.get("VALIDATOR_IMAGE_PULL_POLICY", "")
        if policy and policy not in ("Always", "IfNotPresent", "Never"):
            raise ConfigError(f"VALIDATOR_IMAGE_PULL_POLICY={policy!r}: use Always, IfNotPresent or Never")
        cc = env.get("CC_CAPABLE")
        return cls(
            node_name=env.get("NODE_NAME", ""),
            namespace=env.get("OPERATOR_NAMESPACE", ""),
            with_wait=_bool(env, "WITH_WAIT", False),
            with_workload=_bool(env, "WITH_WORKLOAD", True),
            sleep_interval=_float(env, "SLEEP_INTERVAL_SECONDS", 5.0),
            output_dir=env.get("OUTPUT_DIR", "") or "/run/nvidia/validations",
            mig_strategy=env.get("MIG_STRATEGY", "") or "single",
            default_workload=default_workload,
            workload_override=workload,
            driver_install_dir=env.get("DRIVER_INSTALL_DIR", "") or "/run/nvidia/driver",
            skip_gpu_init=_bool(env, "DRIVER_VALIDATION_SKIP_GPU_INIT", False),
            disable_dev_char_symlinks=_bool(env, "DISABLE_DEV_CHAR_SYMLINK_CREATION", False),
            gpu_direct_rdma=_bool(env, "GPU_DIRECT_RDMA_ENABLED", False),
            cc_capable=None if cc is None or cc == "" else _bool(env, "CC_CAPABLE", False),
            search_dirs=tuple(p for p in env.get("DRIVER_SEARCH_PATHS", "").split(":") if p),
            skipped=frozenset(skipped),
            budgets=budgets,
            validator_image=env.get("VALIDATOR_IMAGE", ""),
            cuda_image=env.get("CUDA_VALIDATOR_IMAGE", "") or env.get("VALIDATOR_IMAGE", ""),
            runtime_class=env.get("VALIDATOR_RUNTIME_CLASS", ""),
            image_pull_policy=env.get("VALIDATOR_IMAGE_PULL_POLICY", ""),
            image_pull_secrets=tuple(s for s in env.get("VALIDATOR_IMAGE_PULL_SECRETS", "").split(",") if s),
            resource_name=env.get("PLUGIN_RESOURCE_NAME", ""),
        )
