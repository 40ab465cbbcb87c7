"""Run one validator component: honour the skip list, write the status file, turn failures into results."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gpu_operator.node.host.hostfs import HostPathError
from gpu_operator.node.validate import host, sandbox, workload
from gpu_operator.node.validate.base import Context, Outcome, ValidationFailed, ValidationResult
from gpu_operator.node.validate.config import COMPONENTS, STATUS_FILES, ValidatorConfigError

VALIDATIONS: dict[str, Callable[[Context], ValidationResult]] = {
    "driver": host.validate_driver,
    "toolkit": host.validate_toolkit,
    "cuda": workload.validate_cuda,
    "plugin": workload.validate_plugin,
    "vfio-pci": sandbox.validate_vfio_pci,
    "vgpu-manager": sandbox.validate_vgpu_manager,
    "vgpu-devices": sandbox.validate_vgpu_devices,
    "cc-manager": sandbox.validate_cc_manager,
    "mofed": host.validate_mofed,
    "nvidia-fs": partial(host.validate_module, component="nvidia-fs"),
    "gdrcopy": partial(host.validate_module, component="gdrcopy"),
    "nvidia-peermem": partial(host.validate_module, component="nvidia-peermem"),
}
assert set(VALIDATIONS) == set(COMPONENTS)


def _skipped(ctx: Context, component: str) -> ValidationResult:
    """A switched-off check still writes its status file, so the components waiting on it proceed."""
    values = {"VALIDATION_SKIPPED": "true"}
    if component == "driver":
        from gpu_operator.node.host.driver import detect_driver

        values = {
            **host.driver_ready_values(
                detect_driver(
                    ctx.fs,
                    extra_search_dirs=ctx.config.search_dirs,
                    operator_root=ctx.config.driver_install_dir,
                ),
                ctx.fs,
                ctx.config.host_root,
            ),
            **values,
        }
    path = ctx.status.write(STATUS_FILES[component], values)
    return ValidationResult(
        component, Outcome.SKIPPED, "switched off by VALIDATOR_SKIP / DISABLE_*_VALIDATION", [path]
    )


def validate(ctx: Context, component: str) -> ValidationResult:
    if component not in VALIDATIONS:
        raise ValidatorConfigError(f"--component {component!r}: use one of {', '.join(COMPONENTS)}")
    try:
        if component in ctx.config.skipped:
            return _skipped(ctx, component)
        return VALIDATIONS[component](ctx)
    except ValidationFailed as err:
        return ValidationResult(component, Outcome.FAILED, str(err))
    except HostPathError as err:
        # A status path on the host leads outside the host root (or loops): nothing is written there.
        return ValidationResult(component, Outcome.FAILED, f"{err}; fix the link on the host")
    except OSError as err:  # a status file's directory is a file, a read-only mount, ...
        return ValidationResult(
            component, Outcome.FAILED, f"{err.strerror}: {err.filename}; fix that path on the host"
        )
