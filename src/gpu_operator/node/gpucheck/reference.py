"""What NVIDIA's own tools say about the GPUs: `nvidia-smi -q -x` (its XML, parsed with the standard
library) and NVML through NVIDIA's Python bindings (nvidia-ml-py, `import pynvml`), in one shape.

nvidia-smi's XML (nvsmi_device_v*.dtd, written by the driver's nvidia-smi): a root
<nvidia_smi_log> with <driver_version>, <cuda_version>, and one <gpu id="00000000:41:00.0"> per GPU
holding <product_name>, <uuid>, <mig_mode><current_mig/><pending_mig/></mig_mode>,
<gpu_virtualization_mode><virtualization_mode/></gpu_virtualization_mode> and
<pci><pci_bus_id/><pci_device_id>233010DE</pci_device_id></pci> (device id, then vendor id).
"""

from __future__ import annotations

import ctypes
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from gpu_operator.node.host.pci import normalise_bus

# NVML's nvmlGpuVirtualizationMode_t, in nvidia-smi's words
NVML_VIRTUALIZATION = {0: "None", 1: "Pass-Through", 2: "VGPU", 3: "Host VGPU", 4: "Host VSGA"}
NVML_MIG = {0: "Disabled", 1: "Enabled"}


class ReferenceError(Exception):
    """NVIDIA's tool answered, but not in a shape we can read; the message says what was wrong."""


@dataclass
class RefGpu:
    bus: str
    vendor_device: str = ""
    product: str = ""
    uuid: str = ""
    mig_current: str | None = None
    mig_pending: str | None = None
    virtualization: str | None = None
    numa_node: int | None = None


@dataclass
class RefReport:
    source: str
    driver_version: str = ""
    cuda_version: str = ""
    gpus: list[RefGpu] = field(default_factory=list)
    # NVML's GPUs that did not answer (index -> NVML's error text): a GPU that fell off the bus answers
    # every call, its PCI address too, with NVML_ERROR_GPU_IS_LOST; the others are still listed
    unanswered: dict[int, str] = field(default_factory=dict)

    def by_bus(self) -> dict[str, RefGpu]:
        return {g.bus: g for g in self.gpus}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in ("", "N/A") else value


def _pci_ids(combined: str | None) -> str:
    """`233010DE` (nvidia-smi's pci_device_id: device, then vendor) -> `10de:2330`."""
    value = (combined or "").lower().removeprefix("0x")
    return f"{value[4:8]}:{value[0:4]}" if len(value) == 8 else ""


def parse_smi_xml(text: str) -> RefReport:
    """nvidia-smi -q -x's output as a RefReport; ReferenceError when it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise ReferenceError(f"nvidia-smi -q -x did not print XML ({err})") from None
    if root.tag != "nvidia_smi_log":
        raise ReferenceError(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    gpus = []
    for gpu in root.findall("gpu"):
        bus = _text(gpu, "pci/pci_bus_id") or gpu.get("id") or ""
        if not bus:
            raise ReferenceError("a <gpu> of nvidia-smi -q -x has neither pci/pci_bus_id nor an id attribute")
        gpus.append(
            RefGpu(
                bus=normalise_bus(bus),
                vendor_device=_pci_ids(_text(gpu, "pci/pci_device_id")),
                product=_text(gpu, "product_name") or "",
                uuid=_text(gpu, "uuid") or "",
                mig_current=_text(gpu, "mig_mode/current_mig"),
                mig_pending=_text(gpu, "mig_mode/pending_mig"),
                virtualization=_text(gpu, "gpu_virtualization_mode/virtualization_mode"),
            )
        )
    return RefReport(
        "nvidia-smi",
        driver_version=_text(root, "driver_version") or "",
        cuda_version=_text(root, "cuda_version") or "",
        gpus=gpus,
    )


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _cuda_version(number: int) -> str:
    """NVML's and the CUDA driver's 12040 -> `12.4`."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _numa(nvml: Any, handle: Any) -> int | None:
    """The one NUMA node NVML puts the GPU's memory affinity on (None: none, several, or unknown)."""
    try:
        mask = nvml.nvmlDeviceGetMemoryAffinity(handle, 1, getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", 0))
    except (nvml.NVMLError, AttributeError):
        return None
    bits = [i for i in range(64) if int(mask[0]) >> i & 1]
    return bits[0] if len(bits) == 1 else None


def _optional(nvml: Any, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except nvml.NVMLError:
        return None


def nvml_report(nvml: Any) -> RefReport:
    """Every GPU as NVML lists it (nvmlInit to nvmlShutdown; queries only, nothing set)."""
    nvml.nvmlInit()
    try:
        report = RefReport(
            "NVML",
            driver_version=_str(nvml.nvmlSystemGetDriverVersion()),
            cuda_version=_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion())),
        )
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                pci = nvml.nvmlDeviceGetPciInfo(handle)
                name, uuid = _str(nvml.nvmlDeviceGetName(handle)), _str(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError as err:
                report.unanswered[index] = str(err)
                continue
            mig = _optional(nvml, partial(nvml.nvmlDeviceGetMigMode, handle))
            virt = _optional(nvml, partial(nvml.nvmlDeviceGetVirtualizationMode, handle))
            combined = int(pci.pciDeviceId)
            report.gpus.append(
                RefGpu(
                    bus=normalise_bus(_str(pci.busId)),
                    vendor_device=f"{combined & 0xFFFF:04x}:{combined >> 16 & 0xFFFF:04x}",
                    product=name,
                    uuid=uuid,
                    mig_current=NVML_MIG.get(mig[0], str(mig[0])) if mig else None,
                    mig_pending=NVML_MIG.get(mig[1], str(mig[1])) if mig else None,
                    virtualization=NVML_VIRTUALIZATION.get(virt, str(virt)) if virt is not None else None,
                    numa_node=_numa(nvml, handle),
                )
            )
        return report
    finally:
        nvml.nvmlShutdown()


def preload(path: str) -> None:
    """Load a driver library by its real path first, so the bindings' dlopen by soname finds it
    (the loader reuses a library already loaded under that soname) where the loader's own
    search path does not reach its directory (a driver under /usr/local/nvidia)."""
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
