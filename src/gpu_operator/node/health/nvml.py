"""NVML, where the driver's library loads (NVIDIA's Python bindings, nvidia-ml-py: `import pynvml`).

As NVIDIA's device plugin does (internal/rm/health.go), one event set with every GPU registered
for Xid critical errors and double-bit ECC errors (as far as each GPU supports them). Each poll
drains the set without waiting, and asks every GPU whether it is lost, needs a reset, or has a row
remapping pending or failed. Without the library (no driver on the host, or not injected into the
container) the agent goes on with the kernel log and sysfs, and says so once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.node.health.kmsg import XidEvent
from gpu_operator.node.pci import normalise_bus

DBE_XID = 48  # a double-bit ECC event is what Xid 48 reports in the kernel log


@dataclass(frozen=True)
class NvmlGpu:
    bus: str
    index: int
    lost: bool = False
    reset_required: bool = False
    remap_pending: bool = False
    remap_failed: bool = False


@dataclass
class NvmlObservation:
    gpus: dict[str, NvmlGpu] = field(default_factory=dict)
    events: list[XidEvent] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource:
    """NVML's view of the GPUs; `available` is False (and `reason` says why) where it does not load."""

    def __init__(self, log: Callable[[str], None], module: Any = None) -> None:
        self.log = log
        self.nvml: Any = None
        self.event_set: Any = None
        self.handles: dict[int, Any] = {}
        self.buses: dict[int, str] = {}
        self.reason = ""
        try:
            self._start(module)
        except Exception as err:  # noqa: BLE001 - any failure of the library leaves us without NVML
            self.reason = f"NVML unavailable ({type(err).__name__}: {err})"
            if self.nvml is not None:
                with contextlib.suppress(Exception):
                    self.nvml.nvmlShutdown()
            self.nvml = None
        if self.nvml is None:
            self.log(f"{self.reason}: watching the kernel log and sysfs only")
        else:
            self.log(f"NVML: watching {len(self.handles)} GPU(s) for Xid critical and double-bit ECC events")

    @property
    def available(self) -> bool:
        return self.nvml is not None

    def _start(self, module: Any) -> None:
        if module is None:
            try:
                import pynvml as module  # type: ignore[no-redef]
            except ImportError as err:
                self.reason = f"NVML unavailable (nvidia-ml-py not installed: {err})"
                return
        module.nvmlInit()
        self.nvml = module
        self.event_set = module.nvmlEventSetCreate()
        wanted = module.nvmlEventTypeXidCriticalError | module.nvmlEventTypeDoubleBitEccError
        for index in range(module.nvmlDeviceGetCount()):
            try:  # a GPU already lost answers nothing: the PCI bus and the kernel log still see it
                handle = module.nvmlDeviceGetHandleByIndex(index)
                bus = normalise_bus(_text(module.nvmlDeviceGetPciInfo(handle).busId))
            except module.NVMLError as err:
                self.log(f"NVML: GPU {index} does not answer ({err}); left to the kernel log and sysfs")
                continue
            self.handles[index], self.buses[index] = handle, bus
            try:
                supported = module.nvmlDeviceGetSupportedEventTypes(handle)
                module.nvmlDeviceRegisterEvents(handle, wanted & supported, self.event_set)
            except module.NVMLError as err:
                self.log(f"NVML: GPU {index} ({bus}) takes no event registration: {err}")

    def _bus_of(self, handle: Any) -> str | None:
        nvml = self.nvml
        try:
            return normalise_bus(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except nvml.NVMLError:
            try:
                return self.buses.get(nvml.nvmlDeviceGetIndex(handle))
            except nvml.NVMLError:
                return None

    def _events(self) -> list[XidEvent]:
        nvml, out = self.nvml, []
        for _ in range(1000):  # a bound: the rest waits for the next poll
            try:
                data = nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except nvml.NVMLError as err:
                if err.value != nvml.NVML_ERROR_TIMEOUT:
                    self.log(f"NVML: waiting for events failed: {err}")
                break
            bus = self._bus_of(data.device)
            if bus is None:
                continue
            if data.eventType == nvml.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                out.append(XidEvent(bus, xid, f"NVML: Xid critical error {xid}", "nvml"))
            elif data.eventType == nvml.nvmlEventTypeDoubleBitEccError:
                out.append(XidEvent(bus, DBE_XID, "NVML: double-bit ECC error", "nvml"))
        return out

    def _state(self, index: int, handle: Any) -> NvmlGpu:
        nvml, bus = self.nvml, self.buses[index]
        try:
            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_GPU_IS_LOST:
                return NvmlGpu(bus, index, lost=True)
            if err.value == nvml.NVML_ERROR_RESET_REQUIRED:
                return NvmlGpu(bus, index, reset_required=True)
        try:
            _, _, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
        except nvml.NVMLError:  # not supported before Ampere, or not answered now
            return NvmlGpu(bus, index)
        return NvmlGpu(bus, index, remap_pending=bool(pending), remap_failed=bool(failed))

    def poll(self) -> NvmlObservation | None:
        """This step's NVML view; None without NVML."""
        if self.nvml is None:
            return None
        events = self._events()
        gpus = {}
        for index, handle in self.handles.items():
            gpu = self._state(index, handle)
            gpus[gpu.bus] = gpu
        return NvmlObservation(gpus, events)

    def close(self) -> None:
        if self.nvml is None:
            return
        try:
            if self.event_set is not None:
                self.nvml.nvmlEventSetFree(self.event_set)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as err:
            self.log(f"NVML: shutdown: {err}")
        self.nvml = None
