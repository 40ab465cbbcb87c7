"""vfio-manage: move NVIDIA GPUs (with their IOMMU-group companions) to vfio-pci and back, or refuse with the reason."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gpu_operator.node.host import pci
from gpu_operator.node.host.holders import gpu_holders, vfio_group_holders
from gpu_operator.node.host.hostfs import HostFS, SysfsWriter

VFIO_DRIVER = "vfio-pci"
_ADDRESS = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{4}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-1][0-9a-f])\.(?P<fn>[0-7])$"
)
VFIOAction = Literal["bind", "unbind"]


class VfioUsageError(ValueError):
    """The command line named no device, or a device that is not an NVIDIA GPU on this host."""


@dataclass
class GpuPlan:
    """What to do for one GPU and the functions that must move with it."""

    gpu: str
    name: str
    functions: list[pci.PciFunction]
    writes: list[tuple[str, str]] = field(default_factory=list)
    refused: str | None = None
    result: str = ""
    ok: bool = True

    @property
    def unchanged(self) -> bool:
        return not self.refused and not self.writes


def normalize_address(text: str) -> str:
    """`0A:00.0`, `0a:00.0` or `0000:0a:00.0` -> `0000:0a:00.0`."""
    match = _ADDRESS.match(text.strip().lower())
    if not match:
        raise VfioUsageError(f"--device {text!r}: expected a PCI address like 0000:0a:00.0 or 0a:00.0")
    return f"{match['domain'] or '0000'}:{match['bus']}:{match['dev']}.{match['fn']}"


def select_gpus(fs: HostFS, devices: list[str], all_gpus: bool) -> list[pci.PciFunction]:
    gpus = [f for f in pci.scan(fs, pci.NVIDIA_VENDOR) if f.is_gpu]
    if all_gpus:
        return gpus
    if not devices:
        raise VfioUsageError("name the GPUs: --all, or --device ADDR (repeatable)")
    by_address = {g.address: g for g in gpus}
    chosen = []
    for text in devices:
        address = normalize_address(text)
        if address not in by_address:
            known = ", ".join(by_address) or "none on this host"
            raise VfioUsageError(
                f"--device {text}: {address} is not an NVIDIA GPU on this host (NVIDIA GPUs: {known})"
            )
        chosen.append(by_address[address])
    return chosen


def _group_functions(fs: HostFS, gpu: pci.PciFunction) -> tuple[list[pci.PciFunction], list[pci.PciFunction]]:
    """(NVIDIA functions that move with the GPU, foreign devices that block it) of its IOMMU group."""
    if gpu.iommu_group is None:
        return [gpu], []
    members = [pci.read_function(fs, a) for a in pci.iommu_group_members(fs, gpu.iommu_group)]
    ours = [m for m in members if m.is_nvidia and not m.is_bridge]
    foreign = [m for m in members if not m.is_nvidia and not m.is_bridge]
    return ours or [gpu], foreign


def persistable(fs: HostFS, gpus: list[pci.PciFunction]) -> tuple[list[str], dict[str, str]]:
    """What `persist` may write for the next boot: (addresses of the functions that move, sorted;
    {GPU address: why it is left out}). The same IOMMU and group rules as bind, so a boot never
    puts a GPU on vfio-pci that bind would refuse (a group shared with a NIC would leave the GPU
    lost to both the host and any VM); processes holding a GPU now do not matter for a boot."""
    selected = {g.address for g in gpus}
    moving: set[str] = set()
    left_out: dict[str, str] = {}
    for gpu in gpus:
        functions, foreign = _group_functions(fs, gpu)
        if refusal := _group_refusal(fs, gpu, functions, foreign, selected):
            left_out[gpu.address] = refusal
        else:
            moving.update(f.address for f in functions)
    return sorted(moving), left_out


def _iommu_refusal(fs: HostFS, gpu: pci.PciFunction) -> str | None:
    if pci.iommu_group_count(fs) == 0:
        return (
            "IOMMU is off: the kernel made no groups under /sys/kernel/iommu_groups, and vfio-pci needs them. "
            "Fix: enable VT-d (Intel) or AMD-Vi/IOMMU in the firmware, boot with intel_iommu=on iommu=pt "
            "(AMD: amd_iommu=on iommu=pt), then reboot"
        )
    if gpu.iommu_group is None:
        return (
            f"{gpu.address} has no iommu_group link although IOMMU is on; check dmesg for DMAR/AMD-Vi errors"
        )
    return None


def _group_refusal(
    fs: HostFS,
    gpu: pci.PciFunction,
    functions: list[pci.PciFunction],
    foreign: list[pci.PciFunction],
    selected: set[str],
) -> str | None:
    """Why this GPU must never be on vfio-pci as the host is built (IOMMU, its group), or None."""
    if refusal := _iommu_refusal(fs, gpu):
        return refusal
    if foreign:
        listed = ", ".join(f"{m.address} ({m.vendor_device}, driver {m.driver or 'none'})" for m in foreign)
        return (
            f"IOMMU group {gpu.iommu_group} also holds non-NVIDIA devices: {listed}. A VM would get them too. "
            "Fix: move the GPU to a slot with its own group, or enable ACS in the firmware"
        )
    if others := [f.address for f in functions if f.is_gpu and f.address not in selected]:
        return (
            f"IOMMU group {gpu.iommu_group} also holds GPU(s) {', '.join(others)}, which must move together. "
            "Fix: name them with --device too, or use --all"
        )
    return None


def _busy_refusal(fs: HostFS, functions: list[pci.PciFunction]) -> str | None:
    """Why the group's functions cannot be unbound now (processes hold them), or None."""
    addresses = {f.address for f in functions}
    if busy := [h for h in gpu_holders(fs) if h.address in addresses]:
        who = ", ".join(f"{h.comm} (pid {h.pid}) holds {h.device}" for h in busy)
        return (
            f"in use: {who}. Unbinding the nvidia driver now would hang in the kernel. Fix: stop those "
            "processes (e.g. `systemctl stop nvidia-persistenced`, drain GPU pods) and run again"
        )
    return None


def _bind_plan(fs: HostFS, gpu: pci.PciFunction, selected: set[str]) -> GpuPlan:
    functions, foreign = _group_functions(fs, gpu)
    plan = GpuPlan(gpu.address, gpu.name, functions)
    plan.refused = _group_refusal(fs, gpu, functions, foreign, selected) or _busy_refusal(fs, functions)
    if plan.refused:
        return plan
    for func in functions:
        if func.on_vfio:
            continue
        base = f"{pci.PCI_DEVICES}/{func.address}"
        if func.driver_override != VFIO_DRIVER:
            plan.writes.append((f"{base}/driver_override", VFIO_DRIVER))
        if func.driver:
            plan.writes.append((f"{pci.PCI_DRIVERS}/{func.driver}/unbind", func.address))
        plan.writes.append(("/sys/bus/pci/drivers_probe", func.address))
    return plan


def _unbind_plan(fs: HostFS, gpu: pci.PciFunction) -> GpuPlan:
    functions, _ = _group_functions(fs, gpu)
    plan = GpuPlan(gpu.address, gpu.name, functions)
    if gpu.iommu_group is not None and (users := vfio_group_holders(fs, gpu.iommu_group)):
        who = ", ".join(f"{comm} (pid {pid})" for pid, comm, _ in users)
        plan.refused = f"in use by a VM: {who} holds /dev/vfio/{gpu.iommu_group}. Fix: stop the VM first"
        return plan
    for func in functions:
        if not func.on_vfio and func.driver_override not in pci.VFIO_DRIVERS:
            continue
        base = f"{pci.PCI_DEVICES}/{func.address}"
        if func.driver_override:
            plan.writes.append((f"{base}/driver_override", "\n"))  # an empty write clears the override
        if func.driver:
            plan.writes.append((f"{pci.PCI_DRIVERS}/{func.driver}/unbind", func.address))
        plan.writes.append(("/sys/bus/pci/drivers_probe", func.address))
    return plan


def plan(fs: HostFS, action: VFIOAction, devices: list[str], all_gpus: bool) -> list[GpuPlan]:
    gpus = select_gpus(fs, devices, all_gpus)
    selected = {g.address for g in gpus}
    plans = [_bind_plan(fs, g, selected) if action == "bind" else _unbind_plan(fs, g) for g in gpus]
    # GPUs sharing an IOMMU group plan the same functions: the first plan makes the writes.
    claimed: set[str] = set()
    for p in plans:
        if p.refused:
            continue
        p.writes = [(path, value) for path, value in p.writes if _write_target(path, value) not in claimed]
        claimed.update(f.address for f in p.functions)
    return plans


def _write_target(path: str, value: str) -> str:
    """The PCI address a planned write is about."""
    if path.endswith("/driver_override"):
        return path.rsplit("/", 2)[-2]
    return value.strip()


def _verify(fs: HostFS, p: GpuPlan, action: VFIOAction) -> None:
    now = {f.address: pci.read_function(fs, f.address).driver for f in p.functions}
    if action == "bind":
        wrong = {a: d for a, d in now.items() if d not in pci.VFIO_DRIVERS}
        p.ok = not wrong
        p.result = (
            f"bound to {VFIO_DRIVER}"
            if p.ok
            else "still not on vfio-pci after the writes: "
            + ", ".join(f"{a} -> {d or 'no driver'}" for a, d in wrong.items())
            + " (is vfio-pci loaded? see dmesg)"
        )
    else:
        drivers = sorted({d or "no driver" for d in now.values()})
        p.ok = all(d not in pci.VFIO_DRIVERS for d in now.values())
        p.result = f"returned to the host: {', '.join(drivers)}"
        if "no driver" in drivers:
            p.result += (
                " (no host driver claims it; load one, e.g. modprobe nvidia, if the host should use it)"
            )


def execute(
    fs: HostFS,
    writer: SysfsWriter,
    action: VFIOAction,
    devices: list[str],
    all_gpus: bool,
    *,
    load_vfio: Callable[[], None] | None = None,
) -> list[GpuPlan]:
    """Plan, refuse what must be refused, make the writes through `writer`, then check the result."""
    plans = plan(fs, action, devices, all_gpus)
    needs_vfio = action == "bind" and any(p.writes and not p.refused for p in plans)
    if needs_vfio and VFIO_DRIVER not in pci.loaded_pci_drivers(fs) and load_vfio is not None:
        load_vfio()
        plans = plan(fs, action, devices, all_gpus)
    if action == "bind" and VFIO_DRIVER not in pci.loaded_pci_drivers(fs):
        for p in plans:
            if not p.refused and p.writes:
                p.refused = (
                    "the vfio-pci driver is not loaded (no /sys/bus/pci/drivers/vfio-pci). Fix: modprobe vfio-pci, "
                    "and persist it with `echo vfio-pci > /etc/modules-load.d/vfio-pci.conf`"
                )
    for p in plans:
        if p.refused:
            p.ok = False
            continue
        if not p.writes:
            p.result = (
                "already on vfio-pci, nothing to do" if action == "bind" else "not on vfio-pci, nothing to do"
            )
            continue
        try:
            for path, value in p.writes:
                writer.write(path, value)
        except OSError as err:
            p.ok = False
            p.result = f"sysfs write failed: {err}"
            continue
        _verify(fs, p, action)
    return plans
