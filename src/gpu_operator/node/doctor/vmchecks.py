"""Checks for GPUs given to VMs beyond today's binding: the next boot (persistence, the VFIO IOMMU
backend), what KubeVirt advertises, and the split of a mixed node (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_operator.node.doctor.verdict import Finding, Severity, finding
from gpu_operator.node.host import pci
from gpu_operator.node.host.persist import regenerate_command
from gpu_operator.node.host.probe import HostReport


@dataclass(frozen=True)
class Advertised:
    """What the node offers KubeVirt for one PCI ID: the resource name ("" when given offline) and its count."""

    vendor_device: str
    resource: str
    count: int


def split_report(report: HostReport, devices: list[str]) -> tuple[HostReport, HostReport]:
    """(the VM part, the container part) of a mixed node: listed GPUs with their card's other functions, the rest."""
    slots = {d.rsplit(".", 1)[0] for d in devices}
    vm = [f for f in report.nvidia_functions if f.slot in slots]
    rest = [f for f in report.nvidia_functions if f.slot not in slots]
    vm_groups = {f.iommu_group for f in vm}
    return (
        report.model_copy(
            update={
                "nvidia_functions": vm,
                "shared_iommu_groups": {
                    g: m for g, m in report.shared_iommu_groups.items() if g in vm_groups
                },
            }
        ),
        report.model_copy(update={"nvidia_functions": rest}),
    )


def unknown_devices(report: HostReport, devices: list[str], source: str) -> list[Finding]:
    known = {g.address for g in report.gpus}
    missing = [d for d in devices if d not in known]
    if not missing:
        return []
    return [
        finding(
            "passthrough-device-unknown",
            Severity.ERROR,
            f"{source} lists PCI addresses that are not NVIDIA GPUs on this host",
            [f"{', '.join(missing)} (GPUs here: {', '.join(sorted(known)) or 'none'})"],
            "List only this host's GPU addresses (see the GPU table)",
        )
    ]


def persistence_findings(report: HostReport, host_gpus: list[str] | None = None) -> list[Finding]:
    """GPUs on vfio-pci now that fall back at the next boot; the VFIO IOMMU backend now and at boot.
    `host_gpus`: every GPU address of the host when `report` is a mixed node's VM part."""
    out: list[Finding] = []
    info = report.persistence
    on_vfio = [g for g in report.gpus if g.on_vfio]
    fleeting = [g.address for g in on_vfio if g.address not in info.persisted]
    regenerate = regenerate_command(info.flavor)
    if fleeting:
        # persist writes the whole list: name what it already keeps too.
        wanted = sorted(set(info.ours) | set(fleeting))
        everything = sorted(host_gpus if host_gpus is not None else [g.address for g in report.gpus])
        devices = "--all" if wanted == everything else " ".join(f"--device {a}" for a in wanted)
        out.append(
            finding(
                "vfio-not-persistent",
                Severity.WARNING,
                f"{len(fleeting)} GPU(s) are bound to vfio-pci now but nothing in the boot configuration puts "
                "them there: they fall back to the host driver at the next boot",
                [
                    f"{a}: no early driver_override script, vfio-pci.ids or modprobe ids covers it"
                    for a in fleeting
                ],
                f"gpu-operator vfio-manage persist {devices}"
                + (f", then {regenerate}" if regenerate else "")
                + " (it prints how to roll back)",
            )
        )
    if on_vfio and not report.vfio_iommu_type1_loaded:
        out.append(
            finding(
                "vfio-iommu-type1-missing",
                Severity.ERROR,
                "vfio_iommu_type1 is not loaded: VMs cannot map guest memory for the GPUs on vfio-pci and fail to start",
                ["vfio_iommu_type1 not in /proc/modules"],
                "modprobe vfio_iommu_type1, and load it at boot (gpu-operator vfio-manage persist adds it to the initramfs)",
            )
        )
    elif info.persisted and info.flavor and "vfio_iommu_type1" not in info.boot_modules:
        out.append(
            finding(
                "vfio-iommu-type1-missing",
                Severity.WARNING,
                "GPUs go to vfio-pci at boot but the initramfs does not load vfio_iommu_type1",
                [f"boot modules ({info.flavor}): {', '.join(info.boot_modules) or 'no vfio module listed'}"],
                "gpu-operator vfio-manage persist writes the vfio, vfio_iommu_type1 and vfio_pci lines"
                + (f"; then {regenerate}" if regenerate else ""),
            )
        )
    return out


def kubevirt_findings(
    report: HostReport, advertised: list[Advertised] | None, unchecked: str = ""
) -> list[Finding]:
    """KubeVirt's device plugin lists a permitted PCI ID's devices when it starts; one that is (or later
    is no longer) on vfio-pci stays advertised, and a VM scheduled onto it fails to start."""
    if advertised is None:
        return [
            finding(
                "kubevirt-count-unchecked",
                Severity.INFO,
                "KubeVirt's advertised GPUs were not checked",
                [unchecked],
            )
        ]
    out: list[Finding] = []
    for adv in advertised:
        ids = adv.vendor_device.lower()
        bound = [g for g in report.gpus if g.vendor_device == ids and g.driver in pci.VFIO_DRIVERS]
        present = [g for g in report.gpus if g.vendor_device == ids]
        if adv.count > len(bound):
            out.append(
                finding(
                    "kubevirt-advertises-unbound",
                    Severity.ERROR,
                    f"KubeVirt advertises {adv.count} GPUs of {ids.upper()}"
                    + (f" ({adv.resource})" if adv.resource else "")
                    + " on the node but only "
                    f"{len(bound)} are bound to vfio-pci: VMs would fail to start on the others",
                    [f"{g.address} -> {g.driver or 'no driver'}" for g in present if g not in bound]
                    or [f"{len(present)} GPU(s) of that ID on the host"],
                    "Bind them (gpu-operator vfio-manage bind --device ADDR), or, if they are meant for containers, "
                    "have the device plugin list the devices again (restart virt-handler, or the sandbox device "
                    "plugin, on this node): it reads them when it starts",
                )
            )
    return out
