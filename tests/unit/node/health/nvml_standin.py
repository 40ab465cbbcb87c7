"""An NVML stand-in (the part of pynvml the health agent and gpu-check call) that follows NVIDIA's
documented behaviour for a GPU that fell off the bus: EVERY call naming it, nvmlDeviceGetHandleByIndex
and its PCI address included, returns NVML_ERROR_GPU_IS_LOST (NVML API reference, "Return values":
"NVML_ERROR_GPU_IS_LOST ... the target GPU has fallen off the bus or is otherwise inaccessible").
Handles are ctypes pointers, as pynvml's are, so the agent can only tell them apart as pynvml's.
The recovery action is the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230): a GPU without one
answers NVML_ERROR_NOT_SUPPORTED in the field's nvmlReturn, as drivers before 565 do."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

# pynvml's numbers (nvidia-ml-py 13.615.71)
NOT_SUPPORTED, TIMEOUT, GPU_IS_LOST, RESET_REQUIRED = 3, 10, 15, 16
XID_EVENT, DBE_EVENT = 0x8, 0x2
RECOVERY_FIELD = 230


class NvmlStandin:
    NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT = NOT_SUPPORTED, TIMEOUT
    NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED = GPU_IS_LOST, RESET_REQUIRED
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError = XID_EVENT, DBE_EVENT
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, buses: list[str]) -> None:
        self.buses = buses  # sysfs form, 0000:3b:00.0; NVML answers 00000000:3B:00.0
        self._memory = [ctypes.c_int(i) for i in range(len(buses))]  # one address per GPU
        self.lost: set[int] = set()
        self.recovery: dict[int, int] = {}  # index -> NVML_GPU_RECOVERY_ACTION_*; absent: NOT_SUPPORTED
        self.supported = XID_EVENT | DBE_EVENT
        self.queue: list[tuple[int, int, int]] = []  # (index, event type, data)
        self.registered: dict[int, int] = {}
        self.inits = 0

    # -- handles: pointers, as pynvml's c_nvmlDevice_t --

    def _handle(self, index: int) -> Any:
        return ctypes.cast(ctypes.pointer(self._memory[index]), ctypes.c_void_p)

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        index = next(i for i, m in enumerate(self._memory) if ctypes.addressof(m) == address)
        if index in self.lost:
            raise self.NVMLError(GPU_IS_LOST)
        return index

    # -- the calls --

    def nvmlInit(self) -> None:  # noqa: N802
        self.inits += 1

    def nvmlShutdown(self) -> None: ...  # noqa: N802
    def nvmlEventSetCreate(self) -> str:
        return "set"  # noqa: N802

    def nvmlEventSetFree(self, _: str) -> None: ...  # noqa: N802
    def nvmlDeviceGetCount(self) -> int:
        return len(self.buses)  # noqa: N802

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.133.20"  # noqa: N802

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080  # noqa: N802

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        if index in self.lost:
            raise self.NVMLError(GPU_IS_LOST)
        return self._handle(index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:  # noqa: N802
        return self._index(handle)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:  # noqa: N802
        index = self._index(handle)
        return SimpleNamespace(busId=f"0000{self.buses[index]}".upper().encode(), pciDeviceId=0x233010DE)

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        self._index(handle)
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return f"GPU-standin-{self._index(handle)}"

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:  # noqa: N802
        self._index(handle)
        return (0, 0)

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:  # noqa: N802
        self._index(handle)
        return 0

    def nvmlDeviceGetMemoryAffinity(self, handle: Any, size: int, scope: int) -> list[int]:  # noqa: N802
        self._index(handle)
        return [1]

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:  # noqa: N802
        self._index(handle)
        return self.supported

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, _: str) -> None:  # noqa: N802
        self.registered[self._index(handle)] = mask

    def nvmlEventSetWait_v2(self, _: str, timeout: int) -> Any:  # noqa: N802
        if not self.queue:
            raise self.NVMLError(TIMEOUT)
        index, kind, data = self.queue.pop(0)
        return SimpleNamespace(device=self._handle(index), eventType=kind, eventData=data)

    def nvmlDeviceGetTemperature(self, handle: Any, _: int) -> int:  # noqa: N802
        self._index(handle)
        return 40

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:  # noqa: N802
        self._index(handle)
        return (0, 0, 0, 0)

    def nvmlDeviceGetFieldValues(self, handle: Any, fields: list[int]) -> list[Any]:  # noqa: N802
        index = self._index(handle)
        out = []
        for field in fields:
            value = self.recovery.get(index) if field == RECOVERY_FIELD else None
            out.append(
                SimpleNamespace(
                    fieldId=field,
                    nvmlReturn=NOT_SUPPORTED if value is None else 0,
                    value=SimpleNamespace(uiVal=value or 0),
                )
            )
        return out
