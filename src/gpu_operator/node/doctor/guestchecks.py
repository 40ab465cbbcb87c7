"""Findings for a node that is itself a VM: what its GPUs were given as, and NVLink without the
fabric (pure). Sources for each rule: docs/vm-passthrough.md, "Inside the VM"."""

from __future__ import annotations

from gpu_operator.node.doctor.verdict import Finding, Severity, finding
from gpu_operator.node.host.probe import HostReport
from gpu_operator.vocabulary import NVLINK_DISABLE_PARAM

# What CUDA reports when the driver still waits for the NVLink fabric (CUDA driver API, cuInit).
CUDA_NOT_READY = 'CUDA_ERROR_SYSTEM_NOT_READY (802, "system not yet initialized")'
FABRIC_QUERY = "nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status --format=csv"


def _kind_line(report: HostReport) -> tuple[str, list[str]]:
    guest = report.guest
    kind = guest.kind
    count = len(report.gpus)
    lines = [
        f"{g.address}: {g.kind}"
        + (
            f" (host vGPU manager {g.host_driver_version}, branch {g.host_driver_branch})"
            if g.host_driver_version
            else ""
        )
        for g in guest.gpus
    ]
    if kind == "passthrough":
        return (
            f"{count} whole GPU(s) passed through: the guest runs NVIDIA's ordinary data-centre driver, "
            "as on bare metal (inferred: no vGPU capability in their PCI configuration space)"
        ), lines
    if kind == "vgpu":
        return (
            f"{count} NVIDIA vGPU(s): the guest needs NVIDIA's vGPU guest driver and a licence "
            "(spec.driver.licensingConfig), and its driver must match the host's vGPU manager branch "
            "(read from the vGPU's PCI capability)"
        ), lines
    if kind == "mixed":
        return f"{count} GPU(s), passed through and vGPUs side by side", lines
    return (
        f"{count} GPU(s) of unknown kind: their PCI configuration space could not be read whole "
        "(run doctor privileged, as root)"
    ), lines


def _nvlink_line(report: HostReport) -> str:
    guest = report.guest
    if not guest.nvlink_gpus:
        return "NVLink: no GPU here reaches its peers through NVSwitches"
    return (
        f"NVLink: {len(guest.nvlink_gpus)} GPU(s) whose NVLink runs through NVSwitches, "
        f"{len(guest.nvswitches)} NVSwitch(es) in this VM"
    )


def guest_findings(report: HostReport) -> list[Finding]:
    """On a VM guest with NVIDIA GPUs: `vm-guest` (what it is), and the NVLink fabric findings."""
    guest = report.guest
    if not guest.is_guest or not report.gpus:
        return []
    summary, lines = _kind_line(report)
    out = [
        finding(
            "vm-guest",
            Severity.INFO,
            f"this node is a virtual machine: {summary}",
            guest.evidence() + lines + [_nvlink_line(report)],
        )
    ]
    if guest.nvswitches and guest.nvlink_gpus:
        out.append(
            finding(
                "nvlink-fabric-in-guest",
                Severity.INFO,
                "NVSwitches were given to this VM with the GPUs: Fabric Manager must run here, in the VM",
                [f"NVSwitch(es): {', '.join(guest.nvswitches)}"],
                "The operator's driver container starts Fabric Manager when /proc/driver/nvidia-nvswitch/devices "
                f"lists NVSwitches; check the fabric with `{FABRIC_QUERY}` (state Completed)",
            )
        )
    if not guest.fabric_missing:
        return out
    gpus = [g for g in guest.nvlink_gpus if g in {x.address for x in guest.gpus if x.kind != "vgpu"}]
    if guest.nvlink_disable == 1:
        out.append(
            finding(
                "nvlink-disabled-in-guest",
                Severity.INFO,
                "NVLink is disabled in this VM's nvidia module: CUDA starts without the NVSwitch fabric, and the "
                "GPUs reach each other over PCIe only",
                [f"/proc/driver/nvidia/params: NvLinkDisable: 1; GPUs: {', '.join(gpus)}"],
            )
        )
        return out
    # NvLinkDisable: 0 as loaded; loaded but the parameter not readable; not loaded yet
    loaded = guest.nvlink_disable is not None
    if loaded:
        state, when = "/proc/driver/nvidia/params: NvLinkDisable: 0", ""
    elif report.driver.kernel_module_loaded:
        state = (
            "the nvidia module is loaded, but /proc/driver/nvidia/params names no NvLinkDisable: not known"
        )
        when = " unless NVLink is disabled"
    else:
        state = "the nvidia module is not loaded yet: nothing gives it NvLinkDisable=1"
        when = " once the nvidia module loads"
    out.append(
        finding(
            "nvlink-fabric-missing",
            Severity.ERROR if loaded else Severity.WARNING,
            f"{len(gpus)} GPU(s) whose NVLink runs through NVSwitches were passed into this VM without them: "
            "the driver waits for a fabric that no Fabric Manager brings up for this VM, and CUDA fails to "
            f"initialise (cuInit returns {CUDA_NOT_READY})" + when,
            [
                f"GPUs: {', '.join(gpus)}",
                "no NVSwitch (NVIDIA PCI function of class 0680) in this VM",
                state,
                f"the fabric's state: `{FABRIC_QUERY}` (not Completed: waiting for Fabric Manager)",
            ],
            f"Load the nvidia module with {NVLINK_DISABLE_PARAM}=1: with this operator's driver, keep "
            "spec.driver.guestNVLink at its default (disable), and the operator adds it for this node, merged into "
            f"driver.kernelModuleConfig's nvidia.conf; with a driver of your own, add `options nvidia "
            f"{NVLINK_DISABLE_PARAM}=1` to /etc/modprobe.d and reload it. Or have the fabric managed for the VM "
            "(Fabric Manager's shared NVSwitch model, on the host side) and set spec.driver.guestNVLink=leave",
        )
    )
    return out
