"""Validations of sandbox (VM) nodes: vfio-pci binding, the vGPU manager and devices, confidential computing."""

from __future__ import annotations

from gpu_operator.node.host import pci
from gpu_operator.node.host.driver import DriverSource, detect_driver
from gpu_operator.node.validate.base import Context, Outcome, ValidationResult
from gpu_operator.node.validate.config import (
    CC_MANAGER_CTR_READY,
    HOST_VGPU_MANAGER_FILE,
    STATUS_FILES,
    WORKLOAD_TYPE_FILE,
)
from gpu_operator.node.vfio.incluster import parse_passthrough_devices
from gpu_operator.node.vfio.manage import VfioUsageError
from gpu_operator.vocabulary import (
    CC_CAPABLE,
    PASSTHROUGH_DEVICES_ANNOTATION,
    WORKLOAD_CONFIG,
    WORKLOAD_CONFIGS,
)


def workload_config(ctx: Context) -> tuple[str, str]:
    """The node's workload config and where it came from: env override, node label, then the default."""
    if ctx.config.workload_override:
        return ctx.config.workload_override, "GPU_WORKLOAD_CONFIG"
    if ctx.kube is not None:
        value = ctx.kube.node_labels().get(WORKLOAD_CONFIG, "")
        if value in WORKLOAD_CONFIGS:
            return value, f"node label {WORKLOAD_CONFIG}"
    return ctx.config.default_workload, "DEFAULT_GPU_WORKLOAD_CONFIG"


def _gpus(ctx: Context) -> list[pci.PciFunction]:
    return [f for f in pci.scan(ctx.fs, pci.NVIDIA_VENDOR) if f.is_gpu]


def passthrough_devices(ctx: Context) -> list[str] | None:
    """A mixed node's GPUs for VMs (its annotation), or None: every GPU when the node is vm-passthrough."""
    if ctx.kube is None:
        return None
    try:
        return (
            parse_passthrough_devices(ctx.kube.node_annotations().get(PASSTHROUGH_DEVICES_ANNOTATION, ""))
            or None
        )
    except VfioUsageError:
        return None  # vfio-manage reports the bad list on the Node; here every GPU must be on vfio-pci


def validate_vfio_pci(ctx: Context) -> ValidationResult:
    status = ctx.status
    status.remove(STATUS_FILES["vfio-pci"])
    workload, origin = workload_config(ctx)
    written = [status.write(WORKLOAD_TYPE_FILE, workload)]
    listed = passthrough_devices(ctx)
    if workload != "vm-passthrough" and not listed:
        return ValidationResult(
            "vfio-pci", Outcome.NOT_APPLICABLE, f"workload config is {workload} ({origin})", written
        )

    def all_on_vfio() -> str | None:
        gpus = [g for g in _gpus(ctx) if listed is None or g.address in listed]
        if not gpus:
            return "no NVIDIA GPU found under /sys/bus/pci/devices" + (
                f" at the addresses of {PASSTHROUGH_DEVICES_ANNOTATION}: {', '.join(listed)}"
                if listed
                else ""
            )
        wrong = [g for g in gpus if not g.on_vfio]
        if not wrong:
            return None
        reason = "not on vfio-pci: " + ", ".join(f"{g.address} -> {g.driver or 'no driver'}" for g in wrong)
        driver = detect_driver(ctx.fs)
        if driver.source == DriverSource.HOST:
            # The silent-skip trap: say plainly that a host driver is in the way.
            reason += "; an NVIDIA host driver is present (" + "; ".join(driver.evidence[:2]) + ")"
        return reason

    ctx.wait(
        all_on_vfio,
        component="vfio-pci",
        what="every passthrough GPU bound to vfio-pci",
        where="/sys/bus/pci/devices/*/driver",
        fix="check the nvidia-vfio-manager pod on this node; run `gpu-operator doctor --workload-config "
        "vm-passthrough` for the host-side cause (host driver, IOMMU off, shared IOMMU group)",
    )
    written.append(status.write(STATUS_FILES["vfio-pci"]))
    count = len(listed) if listed else len(_gpus(ctx))
    where = f" (listed in {PASSTHROUGH_DEVICES_ANNOTATION})" if listed else ""
    return ValidationResult("vfio-pci", Outcome.PASSED, f"{count} GPU(s) on vfio-pci{where}", written)


def _vgpu_parents_ready(ctx: Context) -> str | None:
    if ctx.fs.listdir("/sys/class/mdev_bus"):
        return None
    sriov = [g for g in _gpus(ctx) if g.sriov_totalvfs]
    if sriov and all(g.sriov_numvfs == g.sriov_totalvfs for g in sriov):
        return None
    if sriov:
        return "SR-IOV VFs not all enabled: " + ", ".join(
            f"{g.address} {g.sriov_numvfs}/{g.sriov_totalvfs}" for g in sriov
        )
    return "no mdev parent under /sys/class/mdev_bus and no SR-IOV capable GPU"


def validate_vgpu_manager(ctx: Context) -> ValidationResult:
    status = ctx.status
    status.remove(STATUS_FILES["vgpu-manager"])
    status.remove(HOST_VGPU_MANAGER_FILE)
    workload, origin = workload_config(ctx)
    if workload != "vm-vgpu":
        return ValidationResult(
            "vgpu-manager", Outcome.NOT_APPLICABLE, f"workload config is {workload} ({origin})"
        )
    root = ctx.config.driver_install_dir
    host = detect_driver(ctx.fs, extra_search_dirs=ctx.config.search_dirs)
    on_host = host.source == DriverSource.HOST and host.nvidia_smi is not None

    def manager_answers() -> str | None:
        info = host if on_host else detect_driver(ctx.fs, operator_root=root)
        if info.smi_in_root is None:
            return f"no nvidia-smi on the host or under {root}"
        result = ctx.runner.run([info.smi_in_root], root=info.run_root, timeout=120, env=info.smi_env)
        return None if result.ok else result.summary()

    ctx.wait(
        manager_answers,
        component="vgpu-manager",
        what="the vGPU manager to answer nvidia-smi",
        where="the host" if on_host else root,
        fix="check the nvidia-vgpu-manager-daemonset pod logs (licence, kernel headers)",
        always=True,
    )
    ctx.wait(
        lambda: _vgpu_parents_ready(ctx),
        component="vgpu-manager",
        what="mdev parents or enabled SR-IOV virtual functions",
        where="/sys/class/mdev_bus and /sys/bus/pci/devices/*/sriov_numvfs",
        fix="the vGPU manager enables them once its driver loads; check its logs and `dmesg`",
        always=True,
    )
    name = HOST_VGPU_MANAGER_FILE if on_host else STATUS_FILES["vgpu-manager"]
    return ValidationResult("vgpu-manager", Outcome.PASSED, "vGPU manager ready", [status.write(name)])


def validate_vgpu_devices(ctx: Context) -> ValidationResult:
    status = ctx.status
    status.remove(STATUS_FILES["vgpu-devices"])
    workload, origin = workload_config(ctx)
    if workload != "vm-vgpu":
        return ValidationResult(
            "vgpu-devices", Outcome.NOT_APPLICABLE, f"workload config is {workload} ({origin})"
        )

    def devices() -> str | None:
        if ctx.fs.listdir("/sys/bus/mdev/devices"):
            return None
        # SR-IOV vGPU (Ada and newer): a VF with a vGPU type set counts as a device.
        for address in ctx.fs.listdir(pci.PCI_DEVICES):
            vgpu_type = ctx.fs.read_value(f"{pci.PCI_DEVICES}/{address}/nvidia/current_vgpu_type")
            if vgpu_type and vgpu_type != "0":
                return None
        return "no mdev device and no VF with current_vgpu_type set"

    ctx.wait(
        devices,
        component="vgpu-devices",
        what="at least one vGPU device",
        where="/sys/bus/mdev/devices and /sys/bus/pci/devices/*/nvidia/current_vgpu_type",
        fix="check the vgpu-device-manager pod and the node's nvidia.com/vgpu.config label",
    )
    return ValidationResult(
        "vgpu-devices", Outcome.PASSED, "vGPU devices exist", [status.write(STATUS_FILES["vgpu-devices"])]
    )


def validate_cc_manager(ctx: Context) -> ValidationResult:
    status = ctx.status
    status.remove(STATUS_FILES["cc-manager"])
    capable = ctx.config.cc_capable
    origin = "CC_CAPABLE"
    if capable is None:
        capable = ctx.kube is not None and ctx.kube.node_labels().get(CC_CAPABLE) == "true"
        origin = f"node label {CC_CAPABLE}"
    if not capable:
        return ValidationResult("cc-manager", Outcome.NOT_APPLICABLE, f"node is not CC-capable ({origin})")
    ctx.wait(
        lambda: (
            None if status.exists(CC_MANAGER_CTR_READY) else f"{status.path(CC_MANAGER_CTR_READY)} missing"
        ),
        component="cc-manager",
        what="the CC manager container to finish",
        where=status.path(CC_MANAGER_CTR_READY),
        fix="check the nvidia-cc-manager pod logs on this node",
    )
    return ValidationResult(
        "cc-manager", Outcome.PASSED, "CC mode applied", [status.write(STATUS_FILES["cc-manager"])]
    )
