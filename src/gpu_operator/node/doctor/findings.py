"""What is wrong with a host for its intended GPU workload: findings with severity, evidence and fix (pure)."""

from __future__ import annotations

from gpu_operator.node.doctor.guestchecks import guest_findings
from gpu_operator.node.doctor.verdict import Finding, Severity
from gpu_operator.node.doctor.verdict import finding as _finding
from gpu_operator.node.doctor.vmchecks import persistence_findings, split_report, unknown_devices
from gpu_operator.node.host.driver import DriverSource
from gpu_operator.node.host.probe import HostReport
from gpu_operator.vocabulary import VM_PASSTHROUGH, VM_VGPU, WORKLOAD_CONFIGS

__all__ = ["Finding", "Severity", "diagnose", "has_errors", "intended_workload"]


def intended_workload(report: HostReport, declared: str | None) -> tuple[str, str]:
    """The node's GPU workload config and where that came from (declared label/option, or host signs)."""
    if declared:
        if declared not in WORKLOAD_CONFIGS:
            raise ValueError(f"workload config {declared!r} is not one of {', '.join(WORKLOAD_CONFIGS)}")
        return declared, "declared"
    if report.vgpu_manager_loaded:  # the module NVIDIA's vGPU user guide has `lsmod` show on a vGPU host
        return "vm-vgpu", "inferred from the vGPU manager's kernel module nvidia_vgpu_vfio (loaded)"
    if report.passthrough_intent.present:
        return "vm-passthrough", "inferred from " + "; ".join(report.passthrough_intent.evidence[:3])
    return "container", "default (nothing on the host asks for VMs)"


_BIND_FIX = (
    "Move the GPUs now with `gpu-operator vfio-manage bind --all`, and keep them there across reboots with "
    "`gpu-operator vfio-manage persist --all` (an initramfs script that sets driver_override=vfio-pci before "
    "nvidia loads; it prints the regenerate and rollback commands), or remove the host driver packages"
)


def _passthrough(report: HostReport, vgpu: bool, mixed: bool = False) -> list[Finding]:
    """Passthrough checks over `report`'s GPUs (on a mixed node: the listed ones only, where a host
    driver is expected for the others and only counts when it holds a listed GPU)."""
    out: list[Finding] = []
    gpus = report.gpus
    if not report.iommu.enabled:
        out.append(
            _finding(
                "iommu-off",
                Severity.WARNING if vgpu else Severity.ERROR,
                "IOMMU is off: GPUs cannot be given to VMs",
                [
                    f"/sys/kernel/iommu_groups is empty; kernel command line IOMMU flags: {report.iommu.cmdline_flags or 'none'}"
                ],
                "Enable VT-d (Intel) or AMD-Vi in the firmware, add intel_iommu=on iommu=pt (AMD: amd_iommu=on "
                "iommu=pt) to GRUB_CMDLINE_LINUX, run update-grub and reboot",
            )
        )
    if vgpu:
        return out
    driver = report.driver
    claimed = [g.address for g in gpus if g.driver == "nvidia"]
    if driver.source == DriverSource.HOST and (claimed or not mixed):
        # A loaded module takes back, at the next boot, every GPU that nothing early puts on vfio-pci.
        at_boot = [g.address for g in gpus if g.address not in report.persistence.persisted]
        reclaim = driver.kernel_module_loaded and bool(at_boot)
        out.append(
            _finding(
                "host-driver-on-passthrough",
                Severity.ERROR if claimed or reclaim else Severity.WARNING,
                "an NVIDIA host driver is present on a node meant for VFIO passthrough"
                + (
                    f"; it holds {len(claimed)} GPU(s)"
                    if claimed
                    else (f"; it takes {len(at_boot)} GPU(s) back at the next boot" if reclaim else "")
                ),
                driver.evidence,
                _BIND_FIX
                if claimed or reclaim
                else "The GPUs are on vfio-pci and stay there at boot; remove the host driver packages too, so "
                "nothing on this host loads nvidia (the distribution's nvidia driver and libnvidia packages)",
            )
        )
    not_vfio = [g for g in gpus if not g.on_vfio]
    if not_vfio:
        out.append(
            _finding(
                "gpu-not-on-vfio",
                Severity.ERROR,
                f"{len(not_vfio)} of {len(gpus)} GPU(s) are not bound to vfio-pci; VMs cannot start with them",
                [f"{g.address} ({g.name or g.vendor_device}) -> {g.driver or 'no driver'}" for g in not_vfio],
                (
                    "gpu-operator vfio-manage bind " + " ".join(f"--device {g.address}" for g in not_vfio)
                    if mixed
                    else "gpu-operator vfio-manage bind --all"
                )
                + " (see also host-driver-on-passthrough)",
            )
        )
        busy = [h for h in report.holders if h.address in {g.address for g in not_vfio}]
        if busy:
            out.append(
                _finding(
                    "gpu-in-use",
                    Severity.WARNING,
                    "processes hold GPUs that must move to vfio-pci; vfio-manage will refuse until they stop",
                    [f"{h.comm} (pid {h.pid}) holds {h.device} ({h.address})" for h in busy],
                    "Stop them (e.g. systemctl stop nvidia-persistenced; drain GPU pods), then bind",
                )
            )
    if not report.vfio_pci_loaded:
        out.append(
            _finding(
                "vfio-pci-not-loaded",
                Severity.WARNING,
                "the vfio-pci driver is not loaded (vfio-manage loads it, but it should not depend on that)",
                ["no /sys/bus/pci/drivers/vfio-pci"],
                "modprobe vfio-pci and persist it: echo vfio-pci > /etc/modules-load.d/vfio-pci.conf",
            )
        )
    for group, members in sorted(report.shared_iommu_groups.items()):
        out.append(
            _finding(
                "iommu-group-shared",
                Severity.ERROR,
                f"IOMMU group {group} mixes a GPU with non-NVIDIA devices; it cannot be passed through alone",
                [f"group {group} also holds {', '.join(members)}"],
                "Move the GPU to another slot, or enable ACS in the firmware",
            )
        )
    return out


def _driver(report: HostReport) -> list[Finding]:
    driver = report.driver
    out: list[Finding] = []
    if driver.source == DriverSource.HOST:
        if driver.kernel_module_loaded and not driver.nvidia_smi:
            out.append(
                _finding(
                    "driver-userspace-missing",
                    Severity.ERROR,
                    "the nvidia kernel module is loaded but nvidia-smi was not found, so the driver cannot be validated",
                    driver.evidence,
                    "Install the driver's utilities package, or point the validator at nvidia-smi's directory "
                    "with DRIVER_SEARCH_PATHS",
                )
            )
        elif not driver.kernel_module_loaded and report.gpus:
            out.append(
                _finding(
                    "driver-module-not-loaded",
                    Severity.ERROR,
                    "NVIDIA user space is installed on the host but the nvidia kernel module is not loaded",
                    driver.evidence,
                    "modprobe nvidia; if it fails, check `dmesg` and Secure Boot (`mokutil --sb-state`): "
                    "unsigned modules are rejected",
                )
            )
        else:
            out.append(
                _finding(
                    "host-driver",
                    Severity.INFO,
                    f"the host provides the driver ({driver.flavor}, kernel module {driver.kernel_version or 'unknown'})",
                    driver.evidence,
                    "Set driver.enabled=false in the ClusterPolicy; the validator uses the host driver",
                )
            )
        if driver.operator_root_present:
            out.append(
                _finding(
                    "driver-twice",
                    Severity.WARNING,
                    "both a host driver and an operator driver root are present",
                    driver.evidence,
                    "Pick one: set driver.enabled=false, or remove the host driver packages",
                )
            )
    elif driver.source == DriverSource.NONE and report.gpus:
        out.append(
            _finding(
                "no-driver",
                Severity.WARNING,
                "no NVIDIA driver on this host yet",
                ["no nvidia-smi, libnvidia-ml or nvidia module; /run/nvidia/driver is empty"],
                "Keep driver.enabled=true so the operator's driver DaemonSet installs it",
            )
        )
    unbound = [g.address for g in report.gpus if g.driver is None]
    if unbound and driver.kernel_module_loaded:
        out.append(
            _finding(
                "gpu-unbound",
                Severity.WARNING,
                "GPUs without any driver although nvidia is loaded",
                unbound,
                "Check dmesg for NVRM errors; echo <address> > /sys/bus/pci/drivers_probe",
            )
        )
    return out


def _runtime(report: HostReport) -> list[Finding]:
    rt = report.runtime
    out: list[Finding] = []
    if not rt.name:
        return [
            _finding(
                "no-container-runtime",
                Severity.ERROR,
                "no container runtime found",
                [],
                "Install containerd or cri-o",
            )
        ]
    for error in rt.errors:
        out.append(
            _finding(
                "runtime-config-unreadable", Severity.ERROR, "a runtime config file does not parse", [error]
            )
        )
    host_toolkit = [b for b in report.toolkit_binaries if not b.startswith("/usr/local/nvidia/")]
    where = f"{rt.flavor} config {rt.config_path}" + (
        f" (generated from {rt.template_path})" if rt.template_path else ""
    )
    # CRI-O under the toolkit's hook mode (CRIO_CONFIG_MODE=hook) has no nvidia runtime: its OCI hook
    # in CRI-O's hooks_dir gives containers their GPUs instead.
    if (
        not rt.nvidia_runtime
        and not rt.nvidia_hook
        and report.driver.source in (DriverSource.HOST, DriverSource.OPERATOR)
    ):
        out.append(
            _finding(
                "nvidia-runtime-missing",
                Severity.ERROR if host_toolkit else Severity.WARNING,
                f"no nvidia runtime in the {rt.name} configuration",
                [f"read {', '.join(rt.config_files) or 'no config file'} ({where})"]
                + ([f"host toolkit: {', '.join(host_toolkit)}"] if host_toolkit else []),
                (
                    f"nvidia-ctk runtime configure --runtime={rt.name} --config={rt.template_path or rt.config_path}, "
                    f"then restart {rt.name}"
                    if host_toolkit
                    else "Keep toolkit.enabled=true so the operator's toolkit adds it"
                ),
            )
        )
    if (
        rt.cdi_enabled
        and report.driver.source in (DriverSource.HOST, DriverSource.OPERATOR)
        and not report.nvidia_cdi_specs
    ):
        out.append(
            _finding(
                "cdi-enabled-no-specs",
                Severity.ERROR if host_toolkit else Severity.WARNING,
                "CDI is enabled in the runtime but there is no NVIDIA CDI spec: GPU containers will fail to start",
                [f"{rt.flavor}: CDI enabled; specs found: {[s.path for s in report.cdi_specs] or 'none'}"],
                "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml (or keep toolkit.enabled=true)",
            )
        )
    for spec in report.cdi_specs:
        if spec.error:
            out.append(
                _finding(
                    "cdi-spec-invalid",
                    Severity.ERROR,
                    "a CDI spec does not parse",
                    [f"{spec.path}: {spec.error}"],
                )
            )
    return out


def _container(report: HostReport) -> list[Finding]:
    out = _driver(report) + _runtime(report)
    on_vfio = [g.address for g in report.gpus if g.on_vfio]
    if on_vfio:
        out.append(
            _finding(
                "gpu-on-vfio-in-container-mode",
                Severity.WARNING,
                "GPUs are bound to vfio-pci on a node meant for containers; containers cannot use them",
                on_vfio,
                "gpu-operator vfio-manage unbind "
                + " ".join(f"--device {a}" for a in on_vfio)
                + ", or label the node nvidia.com/gpu.workload.config=vm-passthrough (or list them for VMs)",
            )
        )
    return out


def diagnose(
    report: HostReport, declared_workload: str | None = None, passthrough_devices: list[str] | None = None
) -> list[Finding]:
    """Every finding for the host, errors first. `passthrough_devices` (a mixed node's list of GPUs
    for VMs) splits the checks: passthrough for those, containers for the rest."""
    out = _diagnose(report, declared_workload, passthrough_devices)
    if report.unreadable_paths:
        out.append(
            _finding(
                "host-path-unreadable",
                Severity.WARNING,
                f"{len(report.unreadable_paths)} host path(s) were not read; what they hold is unknown",
                [f"{path}: {why}" for path, why in sorted(report.unreadable_paths.items())],
                "Look at these paths on the host: a symlink that leads outside the host root or in a loop, or "
                "a file far longer than a kernel value, is never followed or read (check --host-root too)",
            )
        )
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(out, key=lambda f: order[f.severity])


def _diagnose(
    report: HostReport, declared_workload: str | None, passthrough_devices: list[str] | None
) -> list[Finding]:
    workload, why = intended_workload(report, declared_workload)
    if passthrough_devices:
        workload, why = (
            "mixed",
            f"{len(passthrough_devices)} GPU(s) listed for VMs: {', '.join(passthrough_devices)}",
        )
    if not report.sysfs_visible:
        return [
            _finding(
                "host-root-incomplete",
                Severity.ERROR,
                "the host root shows no /sys/bus/pci/devices, so no GPU can be seen",
                [f"host root: {report.host_root}"],
                "Point --host-root at the host's / with /sys mounted (a hostPath / volume mounted at /host)",
            )
        ]
    if not report.gpus:
        return [
            _finding(
                "no-nvidia-gpu",
                Severity.INFO,
                "no NVIDIA GPU on this host; nothing to do",
                [f"workload: {workload}"],
            )
        ]
    out = [_finding("workload", Severity.INFO, f"GPU workload config: {workload}", [why])]
    out += guest_findings(report)
    on_vm = workload in (VM_PASSTHROUGH, VM_VGPU)
    nouveau_gpus = [g.address for g in report.gpus if g.driver == "nouveau"]
    if report.nouveau_loaded or nouveau_gpus:
        harmless = on_vm and not nouveau_gpus
        out.append(
            _finding(
                "nouveau-loaded",
                Severity.WARNING if harmless else Severity.ERROR,
                "the nouveau driver is loaded"
                + (f" and holds {', '.join(nouveau_gpus)}" if nouveau_gpus else ""),
                ["nouveau in /proc/modules"],
                "Blacklist it: printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
                "/etc/modprobe.d/blacklist-nouveau.conf; update-initramfs -u; reboot",
            )
        )
    if passthrough_devices:
        vm, containers = split_report(report, passthrough_devices)
        out += unknown_devices(report, passthrough_devices, "the passthrough device list")
        out += _passthrough(vm, vgpu=False, mixed=True)
        out += persistence_findings(vm, [g.address for g in report.gpus])
        out += _container(containers) if containers.gpus else []
    elif on_vm:
        out += _passthrough(report, vgpu=workload == "vm-vgpu")
        out += persistence_findings(report) if workload == VM_PASSTHROUGH else []
    else:
        out += _container(report)
    return out


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == Severity.ERROR for f in findings)
