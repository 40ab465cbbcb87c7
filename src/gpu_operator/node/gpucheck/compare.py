"""Our agents' view of a host against NVIDIA's tools' view, fact by fact (pure).

Verdicts: `match`; `mismatch` (both answered, differently) and `missed` (NVIDIA's tool sees it, our
agent does not) are defects of ours; `not probed` (our agent has no such fact: shown for the
record), `info` (not comparable one to one, e.g. pci.ids names against NVIDIA's product names),
`n/a` (no NVIDIA tool answered).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpu_operator.node.doctor.verdict import Finding
from gpu_operator.node.gpucheck.reference import RefReport
from gpu_operator.node.gpucheck.tools import NvidiaTools
from gpu_operator.node.host.driver import DriverSource
from gpu_operator.node.host.probe import HostReport

MATCH, MISMATCH, MISSED, NOT_PROBED, INFO, NA = "match", "mismatch", "missed", "not probed", "info", "n/a"
DEFECTS = (MISMATCH, MISSED)


@dataclass
class ComparisonRow:
    fact: str
    ours: str
    nvidia_smi: str
    nvml: str
    verdict: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _show(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def verdict(ours: object, refs: list[object]) -> str:
    answered = [r for r in refs if r is not None and r != ""]
    if not answered:
        return NA
    if ours is None or ours == "":
        return MISSED
    return MATCH if all(r == ours for r in answered) else MISMATCH


def _refs(smi: RefReport | None, nvml: RefReport | None) -> list[RefReport]:
    return [r for r in (smi, nvml) if r is not None]


def _row(fact: str, ours: object, smi: object, nvml: object, note: str = "") -> ComparisonRow:
    return ComparisonRow(fact, _show(ours), _show(smi), _show(nvml), verdict(ours, [smi, nvml]), note)


def compare(
    report: HostReport, tools: NvidiaTools, smi: RefReport | None, nvml: RefReport | None
) -> list[ComparisonRow]:
    ours = {g.address: g for g in report.gpus}
    refs = _refs(smi, nvml)
    smi_gpus = smi.by_bus() if smi else {}
    nvml_gpus = nvml.by_bus() if nvml else {}
    count = _row("GPUs", len(ours), len(smi.gpus) if smi else None, len(nvml.gpus) if nvml else None)
    if count.verdict == MISMATCH and all(len(ours) < len(r.gpus) for r in refs):
        count.verdict = MISSED
    rows = [count]
    buses = sorted(set(ours) | set(smi_gpus) | set(nvml_gpus))
    for bus in buses:
        mine, s, n = ours.get(bus), smi_gpus.get(bus), nvml_gpus.get(bus)
        seen = _row(f"{bus} present", "yes" if mine else "no", _yes(s, smi), _yes(n, nvml))
        rows.append(seen)
        if mine is None:
            seen.verdict = MISSED
            continue
        if seen.verdict == MISMATCH:
            seen.note = "our probe lists a GPU NVIDIA's tools do not"
            continue
        rows.append(
            _row(
                f"{bus} PCI ids",
                mine.vendor_device if mine else None,
                s.vendor_device if s else None,
                n.vendor_device if n else None,
            )
        )
        name = ComparisonRow(
            f"{bus} product",
            _show(mine.name if mine else None),
            _show(s.product if s else None),
            _show(n.product if n else None),
            INFO,
            "our name is pci.ids'; NVIDIA's is the board's",
        )
        rows.append(name)
        numa = _row(
            f"{bus} NUMA node",
            mine.numa_node if mine else None,
            None,
            n.numa_node if n else None,
            "NVML: memory affinity",
        )
        if numa.verdict == MISSED:  # the kernel gives no affinity (-1) where NVML names a node: not ours
            numa.verdict, numa.note = INFO, "sysfs numa_node is -1 (none); NVML names a node"
        rows.append(numa)
        rows.append(
            ComparisonRow(
                f"{bus} MIG mode", "not probed", _mig(s), _mig(n), NOT_PROBED, "doctor asks nvidia-smi for it"
            )
        )
        rows.append(_virtualization(report, bus, s, n))
    driver = report.driver
    rows.append(
        _row(
            "driver version",
            driver.kernel_version,
            smi.driver_version if smi else None,
            nvml.driver_version if nvml else None,
            "ours: /proc/driver/nvidia/version",
        )
    )
    cuda = ComparisonRow(
        "CUDA version",
        "not probed",
        _show(smi.cuda_version if smi else None),
        _show(nvml.cuda_version if nvml else None),
        NOT_PROBED,
        "doctor --cuda compares against it",
    )
    rows.append(cuda)
    found = tools.driver_root if refs else None
    rows.append(
        ComparisonRow(
            "driver root",
            _show(driver.driver_root),
            _show(found),
            "-",
            verdict(driver.driver_root, [found]),
            "reference: where nvidia-smi / libraries were found",
        )
    )
    rows.append(
        ComparisonRow(
            "driver source",
            str(driver.source),
            "answers" if smi else "-",
            "answers" if nvml else "-",
            MISSED if refs and driver.source in (DriverSource.NONE, DriverSource.VFIO) else INFO,
        )
    )
    rows.append(
        ComparisonRow(
            "nvidia-smi path",
            _show(driver.nvidia_smi),
            _show(tools.smi.path if smi else None),
            "-",
            verdict(driver.nvidia_smi, [tools.smi.path if smi else None]),
        )
    )
    rows.append(
        ComparisonRow(
            "libnvidia-ml path",
            _show(driver.nvml_library),
            "-",
            _show(tools.nvml.path if nvml else None),
            verdict(driver.nvml_library, [tools.nvml.path if nvml else None]),
        )
    )
    return rows


# nvidia-smi's and NVML's virtualization modes in our guest probe's words (node/host/guest.py); a vGPU
# host's own GPUs are not a guest's
_NVIDIA_MODE = {
    "None": "bare metal",
    "Pass-Through": "passthrough",
    "VGPU": "vgpu",
    "Host VGPU": "bare metal",
    "Host VSGA": "bare metal",
}


def _virtualization(report: HostReport, bus: str, smi: Any, nvml: Any) -> ComparisonRow:
    """Our guest probe's kind of GPU (bare metal, passthrough, vgpu) against NVIDIA's virtualization mode."""
    guest = report.guest
    ours = (
        next((g.kind for g in guest.gpus if g.address == bus), "unknown") if guest.is_guest else "bare metal"
    )
    theirs = [
        _NVIDIA_MODE.get(g.virtualization, g.virtualization) for g in (smi, nvml) if g and g.virtualization
    ]
    row = ComparisonRow(
        f"{bus} virtualization",
        ours,
        _show(smi.virtualization if smi else None),
        _show(nvml.virtualization if nvml else None),
        verdict(ours, list(theirs)),
        f"ours: node/host/guest.py ({'; '.join(guest.evidence()) or 'no hypervisor flag, no VM DMI'}); "
        f"IOMMU {'on' if report.iommu.enabled else 'off'}",
    )
    if ours == "unknown" and theirs:
        row.verdict, row.note = (
            INFO,
            "our probe could not read the GPU's whole PCI configuration space (unprivileged)",
        )
    return row


def _yes(gpu: Any, report: RefReport | None) -> str | None:
    return None if report is None else "yes" if gpu else "no"


def _mig(gpu: Any) -> str:
    if gpu is None or gpu.mig_current is None:
        return "-"
    return str(gpu.mig_current) + (
        f" (pending {gpu.mig_pending})" if gpu.mig_pending not in (None, gpu.mig_current) else ""
    )


def defects(rows: list[ComparisonRow]) -> list[ComparisonRow]:
    return [r for r in rows if r.verdict in DEFECTS]


# doctor findings that say something NVIDIA's tools, answering, show to be false
_NO_GPU = ("host-root-incomplete", "no-nvidia-gpu")
_NO_DRIVER = ("no-driver", "driver-module-not-loaded", "driver-userspace-missing")
_CUDA_REFUSED = ("cuda-driver-too-old", "cuda-minor-compat", "cuda-version-unknown")


def contradictions(findings: list[Finding], ref: RefReport | None) -> dict[str, str]:
    """finding code -> why NVIDIA's tool (nvidia-smi, else NVML) contradicts it; empty without an answer."""
    if ref is None:
        return {}
    out: dict[str, str] = {}
    for f in findings:
        if f.code in _NO_GPU and ref.gpus:
            out[f.code] = f"{ref.source} lists {len(ref.gpus)} GPU(s)"
        elif f.code in _NO_DRIVER:
            out[f.code] = f"{ref.source} answers with driver {ref.driver_version}"
        elif f.code == "gpu-unbound" and (bound := sorted(set(f.evidence) & set(ref.by_bus()))):
            out[f.code] = f"{ref.source} reaches {', '.join(bound)} through the driver"
        elif f.code in _CUDA_REFUSED:
            out[f.code] = f"driver {ref.driver_version} reports CUDA {ref.cuda_version} itself ({ref.source})"
    return out
