"""Validations of what runs on the host itself: the driver, the toolkit, and the extra kernel modules."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpu_operator.node.host import pci
from gpu_operator.node.host.driver import (
    SMI_SEARCH_DIRS,
    DriverInfo,
    DriverSource,
    detect_driver,
    module_names,
    under_root,
)
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.validate.base import Context, Outcome, ValidationFailed, ValidationResult
from gpu_operator.node.validate.config import DRIVER_CTR_READY, STATUS_FILES

# Flags in .driver-ctr-ready -> the extra module validation each one asks for.
_EXTRA_MODULES = {
    "GDRCOPY_ENABLED": "gdrcopy",
    "GDS_ENABLED": "nvidia-fs",
    "GPU_DIRECT_RDMA_ENABLED": "nvidia-peermem",
}
MODULE_OF = {"nvidia-fs": "nvidia_fs", "gdrcopy": "gdrdrv", "nvidia-peermem": "nvidia_peermem"}


# Where the components that source driver-ready mount the host's root and the driver install dir.
HOST_ROOT_CTR_PATH = "/host"
DRIVER_INSTALL_DIR_CTR_PATH = "/driver-root"


def driver_ready_values(info: DriverInfo, fs: HostFS, host_root: str = "/") -> dict[str, str]:
    """The driver-ready file's keys, sourced by every component that needs the driver's location
    (the toolkit, device plugin, MIG manager and DRA kubelet plugin entrypoints): the node's driver
    root on the host, and where those containers see it. A host driver's root is under the host
    root (HOST_ROOT, hostPaths.rootFS) they mount at /host (/host itself, or e.g. /host/usr/local
    on Talos); the operator's driver is the install dir they mount at /driver-root."""
    host = info.source == DriverSource.HOST
    root = info.driver_root or "/"
    # Device nodes live on the host once the host (or the driver container) created them there.
    dev_on_host = host or fs.exists("/dev/nvidiactl")
    return {
        "IS_HOST_DRIVER": str(host).lower(),
        "NVIDIA_DRIVER_ROOT": under_root(host_root, root) if host else root,
        "DRIVER_ROOT_CTR_PATH": under_root(HOST_ROOT_CTR_PATH, root) if host else DRIVER_INSTALL_DIR_CTR_PATH,
        "NVIDIA_DEV_ROOT": host_root if dev_on_host else root,
        "DEV_ROOT_CTR_PATH": HOST_ROOT_CTR_PATH if dev_on_host else DRIVER_INSTALL_DIR_CTR_PATH,
    }


def _smi_argv(ctx: Context, smi: str) -> list[str]:
    return [smi, "--version"] if ctx.config.skip_gpu_init else [smi]


def _run_smi(ctx: Context, info: DriverInfo) -> str | None:
    assert info.smi_in_root is not None
    result = ctx.runner.run(
        _smi_argv(ctx, info.smi_in_root), root=info.run_root, timeout=120, env=info.smi_env
    )
    return None if result.ok else result.summary()


# The host's /dev/char as the validator pod mounts it (read-write; its /host is read-only).
DEV_CHAR_MOUNT = Path("/host-dev-char")


def create_dev_char_symlinks(fs: HostFS, stat_fn=os.stat, link_dir: Path | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """/dev/char/<major>:<minor> -> ../nvidiaX for NVIDIA device nodes (systemd-less hosts lack them).
    The nodes are read in the host root's /dev; the links go into `link_dir` (the pod's mount of
    the host's /dev/char), else into the host root's /dev/char (run on the host)."""
    made = []
    for name in fs.listdir("/dev"):
        if not name.startswith("nvidia"):
            continue
        st = stat_fn(fs.resolve(f"/dev/{name}"))
        if not stat.S_ISCHR(st.st_mode):
            continue
        key = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        target = f"../{name}"
        if link_dir is not None:
            link = link_dir / key
            if not link.is_symlink() or os.readlink(link) != target:
                link.unlink(missing_ok=True)
                link.symlink_to(target)
                made.append(f"/dev/char/{key}")
        elif fs.readlink(f"/dev/char/{key}") != target:
            fs.symlink(f"/dev/char/{key}", target)
            made.append(f"/dev/char/{key}")
    return made


def _host_driver(ctx: Context, info: DriverInfo) -> None:
    if not info.nvidia_smi:
        dirs = ", ".join((*ctx.config.search_dirs, *SMI_SEARCH_DIRS))
        raise ValidationFailed(
            "driver: the nvidia kernel module is loaded on the host but nvidia-smi is in none of "
            f"{dirs}. Likely fix: install the driver utilities, or set DRIVER_SEARCH_PATHS to its directory"
        )
    ctx.wait(
        lambda: _run_smi(ctx, info),
        component="driver",
        what="the host driver to answer nvidia-smi",
        where=f"{info.nvidia_smi} (host root)",
        fix="check `dmesg` for NVRM errors and that the kernel module matches the user space version",
    )


def _operator_driver(ctx: Context) -> DriverInfo:
    status = ctx.status
    root = ctx.config.driver_install_dir

    def ready() -> str | None:
        if not status.exists(DRIVER_CTR_READY):
            return f"{status.path(DRIVER_CTR_READY)} does not exist yet"
        info = detect_driver(ctx.fs, operator_root=root, extra_search_dirs=ctx.config.search_dirs)
        if info.source != DriverSource.OPERATOR:
            return f"no nvidia-smi under {root}"
        return _run_smi(ctx, info)

    ctx.wait(
        ready,
        component="driver",
        what="the operator's driver container (its startup probe writes .driver-ctr-ready)",
        where=f"{status.path(DRIVER_CTR_READY)} and {root}",
        fix="look at the nvidia-driver-daemonset pod on this node (kubectl logs -c nvidia-driver-ctr); if the "
        "host should provide the driver, install it so nvidia-smi is found, or set DRIVER_SEARCH_PATHS",
    )
    return detect_driver(ctx.fs, operator_root=root, extra_search_dirs=ctx.config.search_dirs)


def validate_driver(ctx: Context) -> ValidationResult:
    status = ctx.status
    status.remove(STATUS_FILES["driver"])
    gpus = [f for f in pci.scan(ctx.fs, pci.NVIDIA_VENDOR) if f.is_gpu]
    info = detect_driver(
        ctx.fs,
        gpus_all_on_vfio=bool(gpus) and all(g.on_vfio for g in gpus),
        extra_search_dirs=ctx.config.search_dirs,
        operator_root=ctx.config.driver_install_dir,
    )
    if not gpus:
        raise ValidationFailed(
            "driver: no NVIDIA GPU under /sys/bus/pci/devices, so there is no driver to validate. Likely fix: "
            "this node should not run GPU operands; check its nvidia.com/gpu.present label and the NFD "
            "pci-10de labels, or --host-root if the host's /sys is not visible"
        )
    if info.source == DriverSource.VFIO:
        raise ValidationFailed(
            "driver: every NVIDIA GPU on this node is bound to vfio-pci, so no driver can serve containers. "
            "Likely fix: label the node nvidia.com/gpu.workload.config=vm-passthrough (with "
            "sandboxWorkloads.enabled=true), or give the GPUs back with `gpu-operator vfio-manage unbind --all`"
        )
    if info.source == DriverSource.HOST:
        _host_driver(ctx, info)
        extras: list[str] = []
    else:
        info = _operator_driver(ctx)
        flags = status.read_flags(DRIVER_CTR_READY)
        extras = [comp for flag, comp in _EXTRA_MODULES.items() if flags.get(flag, "").lower() == "true"]
    for component in extras:
        _wait_module(ctx, component, "driver")
    if not ctx.config.disable_dev_char_symlinks:
        link_dir = DEV_CHAR_MOUNT if DEV_CHAR_MOUNT.is_dir() else None
        try:
            create_dev_char_symlinks(ctx.fs, link_dir=link_dir)
        except OSError as err:
            where = link_dir or f"{ctx.fs.root}/dev/char"
            raise ValidationFailed(
                f"driver: cannot create the /dev/char links of the NVIDIA device nodes in {where} ({err.strerror}). "
                f"Likely fix: run the validator as root with the host's /dev/char mounted read-write at "
                f"{DEV_CHAR_MOUNT} (as the operator renders it), or set DISABLE_DEV_CHAR_SYMLINK_CREATION=true"
            ) from None
    path = status.write(STATUS_FILES["driver"], driver_ready_values(info, ctx.fs, ctx.config.host_root))
    source = f"host ({info.flavor})" if info.source == DriverSource.HOST else "operator"
    return ValidationResult(
        "driver",
        Outcome.PASSED,
        f"{source} driver {info.kernel_version or ''} answers nvidia-smi".strip(),
        [path],
    )


def _wait_module(ctx: Context, component: str, budget_of: str) -> None:
    module = MODULE_OF[component]
    ctx.wait(
        lambda: None if module in module_names(ctx.fs) else f"{module} not in /proc/modules",
        component=budget_of,
        what=f"kernel module {module}",
        where="/proc/modules",
        fix=f"check the driver pod's {component} container logs; `modprobe {module}` on the host",
    )


def validate_module(ctx: Context, component: str) -> ValidationResult:
    ctx.status.remove(STATUS_FILES[component])
    _wait_module(ctx, component, component)
    return ValidationResult(
        component,
        Outcome.PASSED,
        f"{MODULE_OF[component]} is loaded",
        [ctx.status.write(STATUS_FILES[component])],
    )


def validate_toolkit(ctx: Context) -> ValidationResult:
    ctx.status.remove(STATUS_FILES["toolkit"])

    def smi_in_container() -> str | None:
        # This container was started with the nvidia runtime class (or CDI injection): the toolkit
        # works when it put nvidia-smi and the driver libraries here.
        result = ctx.runner.run(["nvidia-smi"], root=None, timeout=120)
        return None if result.ok else result.summary()

    ctx.wait(
        smi_in_container,
        component="toolkit",
        what="nvidia-smi injected into this container by the NVIDIA runtime",
        where="the toolkit-validation container",
        fix="check the container-toolkit pod logs and that the runtime config has the nvidia runtime "
        "(run `gpu-operator doctor` on the node)",
    )
    return ValidationResult(
        "toolkit",
        Outcome.PASSED,
        "nvidia-smi runs inside a GPU container",
        [ctx.status.write(STATUS_FILES["toolkit"])],
    )


def validate_mofed(ctx: Context) -> ValidationResult:
    status = ctx.status
    status.remove(STATUS_FILES["mofed"])
    mellanox = bool(pci.scan(ctx.fs, "15b3"))
    if not ctx.config.gpu_direct_rdma or not mellanox:
        why = (
            "GPU_DIRECT_RDMA_ENABLED is not true"
            if not ctx.config.gpu_direct_rdma
            else "no Mellanox (15b3) device"
        )
        return ValidationResult("mofed", Outcome.NOT_APPLICABLE, why)

    def loaded() -> str | None:
        if "mlx5_core" in module_names(ctx.fs) or ctx.fs.exists("/run/mellanox/drivers/.driver-ready"):
            return None
        return "mlx5_core not loaded and /run/mellanox/drivers/.driver-ready missing"

    ctx.wait(
        loaded,
        component="mofed",
        what="the Mellanox OFED driver",
        where="/proc/modules and /run/mellanox/drivers/.driver-ready",
        fix="install MOFED on the host or deploy the Network Operator's OFED driver",
    )
    return ValidationResult(
        "mofed", Outcome.PASSED, "MOFED driver ready", [status.write(STATUS_FILES["mofed"])]
    )
