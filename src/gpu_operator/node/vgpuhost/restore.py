"""One level-triggered pass that puts the desired vGPU host state back, GPU by GPU, in NVIDIA's
order: MIG mode first (MIG-backed types need it; the vGPU device manager applies its MIG config
before its vGPU config), then the VFs (`sriov-manage -e`, which the vGPU user guide says a reboot
undoes), then a vGPU type on each VF (written to `nvidia/current_vgpu_type`, only a type its
`creatable_vgpu_types` lists); Fabric Manager's mode last. Each step first reads what is there
and changes only what differs, so a second pass changes nothing; a VF a VM holds is never
touched, nor the VFs of its GPU disabled: the step is skipped and reported.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from gpu_operator.node.host import pci
from gpu_operator.node.host.hostfs import HostFS, SysfsWriter
from gpu_operator.node.vgpuhost import sysfs
from gpu_operator.node.vgpuhost.config import DesiredVGPUConfig, GpuDesired

RestoreOutcome = Literal["ok", "changed", "skipped", "failed"]
FM_CONFIG = "/usr/share/nvidia/nvswitch/fabricmanager.cfg"
NVSWITCH_CLASS = "0680"
_FABRIC_MODE = re.compile(r"^FABRIC_MODE=(\d+)\s*$", re.MULTILINE)


class VgpuControl(Protocol):
    """What the agent asks of the vGPU manager's tools (nvidia-smi, sriov-manage)."""

    def mig_mode(self, address: str) -> tuple[bool, bool] | None: ...  # (current, pending)

    def set_mig_mode(self, address: str, enabled: bool) -> str | None: ...  # an error, or None

    def enable_vfs(self, address: str) -> str | None: ...

    def disable_vfs(self, address: str) -> str | None: ...


class RestoreStep(BaseModel):
    gpu: str  # a PCI address, or "node" for Fabric Manager
    step: Literal["mig-mode", "vfs", "vgpu-types", "fabric-manager"]
    outcome: RestoreOutcome
    detail: str
    field: str = ""
    creatable: list[str] = Field(default_factory=list)

    def line(self) -> str:
        return f"{self.gpu} {self.step}: {self.outcome}: {self.detail}"


def _mig(gpu: GpuDesired, pf: sysfs.PhysicalFunction, control: VgpuControl) -> RestoreStep:
    want = "on" if gpu.mig else "off"
    mode = control.mig_mode(gpu.address)
    if mode is None:
        if not gpu.mig:
            return RestoreStep(
                gpu=gpu.address, step="mig-mode", outcome="ok", detail="not MIG-capable; MIG off wanted"
            )
        return RestoreStep(
            gpu=gpu.address,
            step="mig-mode",
            outcome="failed",
            field=gpu.field,
            detail="MIG-backed vGPU types asked for, but nvidia-smi reports no MIG mode for this GPU",
        )
    current, pending = mode
    if current == gpu.mig:
        return RestoreStep(gpu=gpu.address, step="mig-mode", outcome="ok", detail=f"MIG {want}")
    if pf.in_use:
        return RestoreStep(
            gpu=gpu.address,
            step="mig-mode",
            outcome="skipped",
            detail=f"MIG {want} wanted, but VMs hold VFs: {'; '.join(h for vf in pf.in_use for h in vf.holders)}",
        )
    error = control.set_mig_mode(gpu.address, gpu.mig)
    if error:
        return RestoreStep(
            gpu=gpu.address, step="mig-mode", outcome="failed", detail=f"setting MIG {want}: {error}"
        )
    after = control.mig_mode(gpu.address)
    if after is not None and after[0] != gpu.mig:
        return RestoreStep(
            gpu=gpu.address,
            step="mig-mode",
            outcome="failed",
            detail=f"MIG {want} is pending, not current: the GPU needs a reset (Ampere) before vGPUs can use it",
        )
    return RestoreStep(
        gpu=gpu.address,
        step="mig-mode",
        outcome="changed",
        detail=f"MIG {want} (was {'on' if current else 'off'})",
    )


MDEV_NOTE = "the mdev framework: its vGPUs are the vGPU device manager's to create"


def _vfs(gpu: GpuDesired, pf: sysfs.PhysicalFunction, control: VgpuControl) -> RestoreStep:
    if not pf.totalvfs and pf.mdev:
        return RestoreStep(gpu=gpu.address, step="vfs", outcome="ok", detail=f"no SR-IOV; {MDEV_NOTE}")
    if not pf.totalvfs:
        return RestoreStep(
            gpu=gpu.address,
            step="vfs",
            outcome="failed",
            detail="no sriov_totalvfs: this GPU has no SR-IOV VFs (an mdev-framework or non-SR-IOV GPU)",
        )
    if pf.numvfs == pf.totalvfs:
        return RestoreStep(
            gpu=gpu.address, step="vfs", outcome="ok", detail=f"{pf.numvfs}/{pf.totalvfs} VFs enabled"
        )
    if pf.numvfs:
        if pf.in_use:
            return RestoreStep(
                gpu=gpu.address,
                step="vfs",
                outcome="skipped",
                detail=f"{pf.numvfs}/{pf.totalvfs} VFs; re-enabling all would remove VFs VMs hold: "
                + "; ".join(h for vf in pf.in_use for h in vf.holders),
            )
        error = control.disable_vfs(gpu.address)
        if error:
            return RestoreStep(
                gpu=gpu.address, step="vfs", outcome="failed", detail=f"sriov-manage -d: {error}"
            )
    error = control.enable_vfs(gpu.address)
    if error:
        return RestoreStep(gpu=gpu.address, step="vfs", outcome="failed", detail=f"sriov-manage -e: {error}")
    return RestoreStep(
        gpu=gpu.address,
        step="vfs",
        outcome="changed",
        detail=f"enabled {pf.totalvfs} VFs (had {pf.numvfs or 0})",
    )


def _write(writer: SysfsWriter, vf: str, type_id: int) -> str | None:
    """Write a VF's vGPU type (0 removes it); the driver's refusal, or None."""
    try:
        writer.write(f"{pci.PCI_DEVICES}/{vf}/nvidia/current_vgpu_type", str(type_id))
    except OSError as err:
        return f"writing {type_id} to {vf}/nvidia/current_vgpu_type: {err.strerror or err}"
    return None


def _types(
    gpu: GpuDesired, read: Callable[[], sysfs.PhysicalFunction], writer: SysfsWriter, known: dict[str, int]
) -> RestoreStep:
    pf = read()
    if len(gpu.vf_types) > len(pf.vfs):
        return RestoreStep(
            gpu=gpu.address,
            step="vgpu-types",
            outcome="failed",
            field=gpu.field,
            detail=f"{len(gpu.vf_types)} vGPUs asked for, the GPU has {len(pf.vfs)} VFs",
        )
    known.update({t.short: t.id for vf in pf.vfs for t in vf.creatable})
    changed, skipped = [], []
    plan = {i: known.get(name) for i, name in enumerate(gpu.vf_types)}
    stale = [
        vf
        for vf in pf.vfs
        if vf.current and vf.current in known.values() and plan.get(vf.index) != vf.current
    ]
    if stale and pf.in_use:
        return RestoreStep(
            gpu=gpu.address,
            step="vgpu-types",
            outcome="skipped",
            detail=f"the GPU has another vGPU layout than {gpu.vf_types} and VMs hold VFs of it: "
            + "; ".join(f"virtfn{vf.index} {vf.address} {h}" for vf in pf.in_use for h in vf.holders)
            + "; it keeps its layout until they stop",
        )
    if stale:
        # Another layout is there: clear every vGPU of the GPU first, as the vGPU device manager does,
        # since what a VF may create depends on its siblings' types.
        for vf in pf.vfs:
            error = _write(writer, vf.address, 0) if vf.current else None
            if error:
                return RestoreStep(gpu=gpu.address, step="vgpu-types", outcome="failed", detail=error)
        changed.append(f"cleared {sum(1 for vf in pf.vfs if vf.current)} vGPU(s) of another layout")
    for i, name in enumerate(gpu.vf_types):
        vf = read().vfs[i]  # a write changes what the other VFs may create: read afresh
        if vf.current is None and vf.mdev:
            return RestoreStep(
                gpu=gpu.address, step="vgpu-types", outcome="ok", detail=f"{vf.address}: {MDEV_NOTE}"
            )
        if vf.current is None:
            return RestoreStep(
                gpu=gpu.address,
                step="vgpu-types",
                outcome="failed",
                detail=f"{vf.address} has neither nvidia/current_vgpu_type (the vendor-specific VFIO "
                "framework) nor mdev_supported_types: is the vGPU manager's driver loaded?",
            )
        known.update({t.short: t.id for t in vf.creatable})
        if vf.current != 0 and vf.current == known.get(name):
            continue
        if vf.current != 0 and vf.holders:
            skipped.append(
                f"virtfn{i} {vf.address} has type id {vf.current}, not {name}, and is in use: "
                + "; ".join(vf.holders)
            )
            continue
        if vf.current != 0 and name not in known and vf.current not in known.values():
            # A fully used GPU's VFs list no types: without a record of the ids, leave the vGPU alone.
            skipped.append(
                f"virtfn{i} {vf.address} has type id {vf.current}; whether that is {name} is not "
                "known (no VF lists either id, no record has them): left as is"
            )
            continue
        error = _write(writer, vf.address, 0) if vf.current != 0 else None
        if error:
            return RestoreStep(gpu=gpu.address, step="vgpu-types", outcome="failed", detail=error)
        vf = read().vfs[i]
        wanted = next((t for t in vf.creatable if t.short == name), None)
        if wanted is None:
            return RestoreStep(
                gpu=gpu.address,
                step="vgpu-types",
                outcome="failed",
                field=gpu.field,
                creatable=[t.short for t in vf.creatable],
                detail=f"{name} cannot be created on virtfn{i} {vf.address}; it can create: "
                + (", ".join(t.short for t in vf.creatable) or "nothing"),
            )
        error = _write(writer, vf.address, wanted.id)
        if error:
            return RestoreStep(gpu=gpu.address, step="vgpu-types", outcome="failed", detail=error)
        changed.append(f"virtfn{i}={name}")
    if skipped:
        return RestoreStep(gpu=gpu.address, step="vgpu-types", outcome="skipped", detail="; ".join(skipped))
    if changed:
        return RestoreStep(
            gpu=gpu.address, step="vgpu-types", outcome="changed", detail="set " + ", ".join(changed)
        )
    return RestoreStep(
        gpu=gpu.address,
        step="vgpu-types",
        outcome="ok",
        detail=f"{len(gpu.vf_types)} VF(s) have their types" if gpu.vf_types else "no vGPU asked for",
    )


def vfs_pf_sriov(fs: HostFS, address: str) -> bool:
    return bool(sysfs.read_pf(fs, address).totalvfs)


def has_nvswitch(fs: HostFS) -> bool:
    return any(f.pci_class.startswith(NVSWITCH_CLASS) for f in pci.scan(fs, pci.NVIDIA_VENDOR))


def _fabric(desired: DesiredVGPUConfig, fs: HostFS) -> RestoreStep | None:
    if desired.fabric_mode is None or not has_nvswitch(fs):
        return None
    text = fs.read_text(FM_CONFIG)
    mode = desired.fabric_mode
    if text is None:
        return RestoreStep(
            gpu="node",
            step="fabric-manager",
            outcome="failed",
            field=desired.fabric_mode_source,
            detail=f"FABRIC_MODE={mode} wanted, but the host has no {FM_CONFIG}: install Fabric Manager on "
            f"the host, or use a vGPU manager image that runs it with NVFM_CONFIG_FABRIC_MODE={mode} "
            "from spec.vgpuManager.env",
        )
    found = _FABRIC_MODE.search(text)
    if found and int(found.group(1)) == mode:
        return RestoreStep(
            gpu="node", step="fabric-manager", outcome="ok", detail=f"FABRIC_MODE={mode} in {FM_CONFIG}"
        )
    new = (
        _FABRIC_MODE.sub(f"FABRIC_MODE={mode}", text)
        if found
        else text.rstrip("\n") + f"\nFABRIC_MODE={mode}\n"
    )
    fs.write_atomic(FM_CONFIG, new)
    was = found.group(1) if found else "unset"
    return RestoreStep(
        gpu="node",
        step="fabric-manager",
        outcome="changed",
        detail=f"FABRIC_MODE={mode} written to {FM_CONFIG} (was {was}); restart nvidia-fabricmanager to run in it",
    )


def restore(
    fs: HostFS,
    desired: DesiredVGPUConfig,
    writer: SysfsWriter,
    control: VgpuControl,
    known: dict[str, int] | None = None,
) -> list[RestoreStep]:
    """One pass over every GPU the config names, then Fabric Manager. `known` maps type names to ids
    seen before (a fully used GPU's VFs list none), and is updated."""
    known = {} if known is None else known
    steps: list[RestoreStep] = []
    for gpu in desired.gpus:
        pf = sysfs.read_pf(fs, gpu.address)
        mig = _mig(gpu, pf, control)
        steps.append(mig)
        if mig.outcome in ("failed", "skipped") and gpu.mig:
            continue  # MIG-backed types cannot be created without MIG mode
        vfs = _vfs(gpu, sysfs.read_pf(fs, gpu.address), control)
        steps.append(vfs)
        if vfs.outcome == "failed" or not vfs_pf_sriov(fs, gpu.address):
            continue
        steps.append(_types(gpu, functools.partial(sysfs.read_pf, fs, gpu.address), writer, known))
    fabric = _fabric(desired, fs)
    if fabric is not None:
        steps.append(fabric)
    return steps


def state_of(steps: list[RestoreStep]) -> str:
    outcomes = {s.outcome for s in steps}
    if "failed" in outcomes:
        return "failed"
    if "skipped" in outcomes:
        return "partial"
    return "restored" if "changed" in outcomes else "unchanged"
