"""NVML, where the driver's library loads (NVIDIA's Python bindings, nvidia-ml-py: `import pynvml`).

As NVIDIA's device plugin does (internal/rm/health.go), one event set with every GPU registered
for Xid critical errors and double-bit ECC errors (as far as each GPU supports them). Each poll
drains the set without waiting, and asks every GPU whether it is lost, needs a reset, has a row
remapping pending or failed, and (drivers from 565) which recovery action the driver asks for
(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; NOT_SUPPORTED: none offered). Without the library (no driver
on the host, or not injected into the container) the agent goes on with the kernel log and sysfs,
and says so once.

A GPU that fell off the bus answers every call with NVML_ERROR_GPU_IS_LOST, its PCI address too.
As NVIDIA's device plugin does (internal/rm/health.go: a device whose handle cannot be had is marked
unhealthy; an event whose device cannot be identified marks all devices), what NVML cannot tie to
one GPU marks every GPU it could be: a GPU lost at start (or when NVML is started again) marks the
node's GPUs NVML could not identify, and an event whose device no longer answers marks the GPUs
that do not answer (all of the node's when every one does), each with a log line.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.node.health.kmsg import XidEvent
from gpu_operator.node.host.pci import normalise_bus

DBE_XID = 48  # a double-bit ECC event is what Xid 48 reports in the kernel log
RECOVERY_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvidia-ml-py 13.615.71)
# nvmlDeviceGpuRecoveryAction_t (nvidia-ml-py's NVML_GPU_RECOVERY_ACTION_*), in our words
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu-reset",
    2: "node-reboot",
    3: "drain-p2p",
    4: "drain-and-reset",
    5: "recover-imex-domain",
    6: "bus-reset",
    7: "system-reboot",
}


@dataclass(frozen=True)
class NvmlGpu:
    bus: str
    index: int | None  # None: a GPU NVML could not identify (one of the candidates it could be)
    lost: bool = False
    reset_required: bool = False
    remap_pending: bool = False
    remap_failed: bool = False
    recovery: str | None = None  # the driver's recovery action (RECOVERY_ACTIONS); None: not offered
    why: str = ""  # how a lost GPU was found, when NVML could not name it


@dataclass
class NvmlObservation:
    gpus: dict[str, NvmlGpu] = field(default_factory=dict)
    events: list[XidEvent] = field(default_factory=list)


def handle_key(handle: Any) -> Any:
    """A handle's identity: the address a ctypes pointer holds (pynvml's handles), else the value."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


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
        self.keys: dict[Any, int] = {}  # a handle's identity -> its index (no NVML call needed)
        self.unidentified: dict[int, int] = {}  # index -> NVML's error, GPUs that did not answer at start
        self.xid_buses: set[str] = set()  # GPUs registered for Xid events: the kernel log is their fallback
        self.recovery_supported: set[int] = set()
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
            try:  # a GPU already lost answers nothing, not even its address
                handle = module.nvmlDeviceGetHandleByIndex(index)
                bus = normalise_bus(_text(module.nvmlDeviceGetPciInfo(handle).busId))
            except module.NVMLError as err:
                self.unidentified[index] = getattr(err, "value", -1)
                lost = self.unidentified[index] == getattr(module, "NVML_ERROR_GPU_IS_LOST", None)
                self.log(
                    f"NVML: GPU {index} does not answer ({err})"
                    + ("; lost: every GPU of the node NVML cannot name is marked" if lost else "")
                )
                continue
            self.handles[index], self.buses[index] = handle, bus
            self.keys[handle_key(handle)] = index
            try:
                supported = module.nvmlDeviceGetSupportedEventTypes(handle)
                module.nvmlDeviceRegisterEvents(handle, wanted & supported, self.event_set)
            except module.NVMLError as err:
                self.log(f"NVML: GPU {index} ({bus}) takes no event registration: {err}")
            else:
                if supported & module.nvmlEventTypeXidCriticalError:
                    self.xid_buses.add(bus)

    def _bus_of(self, handle: Any) -> str | None:
        """The bus of an event's device: by its handle's identity (a lost GPU answers no call), else
        by asking NVML; None when neither names it."""
        index = self.keys.get(handle_key(handle))
        if index is not None:
            return self.buses[index]
        nvml = self.nvml
        try:
            return normalise_bus(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        except nvml.NVMLError:
            return None

    def _events(self, states: dict[str, NvmlGpu], gpus: set[str]) -> list[XidEvent]:
        nvml, out = self.nvml, []
        for _ in range(1000):  # a bound: the rest waits for the next poll
            try:
                data = nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except nvml.NVMLError as err:
                if err.value != nvml.NVML_ERROR_TIMEOUT:
                    self.log(f"NVML: waiting for events failed: {err}")
                break
            if data.eventType == nvml.nvmlEventTypeXidCriticalError:
                xid, line = int(data.eventData), f"NVML: Xid critical error {int(data.eventData)}"
            elif data.eventType == nvml.nvmlEventTypeDoubleBitEccError:
                xid, line = DBE_XID, "NVML: double-bit ECC error"
            else:
                continue
            bus = self._bus_of(data.device)
            if bus is not None:
                out.append(XidEvent(bus, xid, line, "nvml"))
                continue
            silent = {b for b, g in states.items() if g.lost} | (gpus - set(self.buses.values()))
            marked = sorted(silent or gpus)
            self.log(
                f"NVML: {line} on a device NVML can no longer name; marking every GPU it could be: "
                f"{', '.join(marked) or 'none known'}"
            )
            out += [
                XidEvent(b, xid, f"{line} (device not identified; one of {len(marked)})", "nvml")
                for b in marked
            ]
        return out

    def _recovery(self, index: int, handle: Any) -> str | None:
        nvml = self.nvml
        if not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return None
        try:
            value = nvml.nvmlDeviceGetFieldValues(handle, [RECOVERY_FIELD])[0]
        except nvml.NVMLError:
            return None
        if int(value.nvmlReturn) != 0:  # NOT_SUPPORTED (before 565, or this GPU): none offered
            return None
        number = int(value.value.uiVal)
        return RECOVERY_ACTIONS.get(number, f"unknown-{number}")

    def _state(self, index: int, handle: Any) -> NvmlGpu:
        nvml, bus = self.nvml, self.buses[index]
        try:
            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_GPU_IS_LOST:
                return NvmlGpu(bus, index, lost=True)
            if err.value == nvml.NVML_ERROR_RESET_REQUIRED:
                return NvmlGpu(bus, index, reset_required=True, recovery=self._recovery(index, handle))
        recovery = self._recovery(index, handle)
        try:
            _, _, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
        except nvml.NVMLError:  # not supported before Ampere, or not answered now
            return NvmlGpu(bus, index, recovery=recovery)
        return NvmlGpu(bus, index, remap_pending=bool(pending), remap_failed=bool(failed), recovery=recovery)

    def _unidentified(self, gpus: set[str], states: dict[str, NvmlGpu]) -> dict[str, NvmlGpu]:
        """The GPUs lost at start, each marked on every GPU of the node NVML could not name."""
        lost = [i for i, code in self.unidentified.items() if code == self.nvml.NVML_ERROR_GPU_IS_LOST]
        if not lost:
            return {}
        candidates = sorted(gpus - set(states))
        why = (
            f"NVML: GPU {', '.join(map(str, lost))} is lost and cannot name its bus; marked on every GPU "
            f"NVML cannot name ({len(candidates)})"
        )
        return {
            b: NvmlGpu(b, lost[0] if len(lost) == len(candidates) == 1 else None, lost=True, why=why)
            for b in candidates
        }

    def poll(self, gpus: set[str] | frozenset[str] = frozenset()) -> NvmlObservation | None:
        """This step's NVML view; None without NVML. `gpus`: the node's GPUs as the host shows them
        (the candidates for what NVML cannot name)."""
        if self.nvml is None:
            return None
        states = {}
        for index, handle in self.handles.items():
            gpu = self._state(index, handle)
            states[gpu.bus] = gpu
        events = self._events(states, set(gpus))
        return NvmlObservation({**self._unidentified(set(gpus), states), **states}, events)

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
