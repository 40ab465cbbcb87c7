"""NVML as a node's host tree and its fault book (`sim/hardware/faults.py`) make it answer: a module object
with the part of pynvml our health agent calls (`node.health.nvml.NvmlSource`), so that the
agent's own code reads NVML on kwok nodes as it does in its pod.

- The GPUs: the intact host's, in PCI address order (the book's list, else the driver's /proc
  entries), numbered as NVML numbers them. A GPU the book says fell off the bus answers every
  call with NVML_ERROR_GPU_IS_LOST, its handle and PCI address too (NVML API reference, return
  values: "the target GPU has fallen off the bus or is otherwise inaccessible").
- Events: an event set gets the Xids `sim fault` logs after the set was made, each once, as an
  Xid critical error event on the GPU's handle (NVML delivers events that happen after
  registration, to the GPUs registered for them). The book keeps each Xid's kernel-log sequence
  number; a set remembers the last it delivered (and the boot it was made in).
- The recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, field 230): where the tree's driver
  is 565 or later, per GPU the action NVIDIA's driver keeps for the Xids of this boot since its
  last reset (`sim/hardware/recovery.py`: none after a reset or a reboot); below 565 the field answers
  NVML_ERROR_NOT_SUPPORTED, as NVML does.

The tree is read through the caller's HostFS at each call (the health stand-in re-roots a live
agent's HostFS at the node's own tree), and the book beside it (`book_dir`, by default the tree's
parent: `<hosts>/<node>/`, where `NodeHosts` keeps it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import recovery
from gpu_operator.sim.hardware.faults import BOOK, KMSG, last_seq
from gpu_operator.sim.realnode.toolkit import gpus as tree_gpus

# pynvml's numbers (nvidia-ml-py 13.615.71)
SUCCESS, NOT_SUPPORTED, NOT_FOUND, TIMEOUT, GPU_IS_LOST, RESET_REQUIRED = 0, 3, 6, 10, 15, 16
XID_EVENT, DBE_EVENT = 0x8, 0x2
RECOVERY_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass
class EventSet:
    boots: int
    seq: int  # the kernel log's last record when the set was made, then the last Xid delivered
    registered: dict[int, int] = field(default_factory=dict)  # index -> event mask


class TreeNvml:
    """pynvml as one host tree answers it (`fs`, read at each call)."""

    NVMLError = NVMLError
    NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND = SUCCESS, NOT_SUPPORTED, NOT_FOUND
    NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED = (
        TIMEOUT,
        GPU_IS_LOST,
        RESET_REQUIRED,
    )
    nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError = XID_EVENT, DBE_EVENT
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = RECOVERY_FIELD

    def __init__(self, fs: HostFS, book_dir: Callable[[], Path] | None = None) -> None:
        self.fs = fs
        self.book_dir = book_dir or (lambda: Path(fs.root).parent)
        self.addresses: list[str] = []  # index -> PCI address, as at nvmlInit
        # what was read last, kept while it stays the same: the book (by path, mtime, inode, size);
        # the tree's root -> its driver's version (a driver is loaded once per boot)
        self.read: tuple[tuple[Path, int, int, int], dict[str, Any]] | None = None
        self.versions: dict[Path, str] = {}

    # -- the tree and its book --

    def _book(self) -> dict[str, Any]:
        path = self.book_dir() / BOOK
        try:
            seen = path.stat()  # the book is replaced whole at each save: a new inode
            key = (path, seen.st_mtime_ns, seen.st_ino, seen.st_size)
            if self.read is not None and self.read[0] == key:
                return self.read[1]
            raw = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        book = raw if isinstance(raw, dict) else {}
        self.read = (key, book)
        return book

    def _driver(self) -> str:
        root = Path(self.fs.root)
        if root not in self.versions:
            self.versions[root] = recovery.driver_version(self.fs)
        return self.versions[root]

    def _address(self, handle: Any) -> str:
        """The handle's GPU; GPU_IS_LOST when the book says it left the bus."""
        if not isinstance(handle, Handle) or not 0 <= handle.index < len(self.addresses):
            raise NVMLError(NOT_FOUND)
        address = self.addresses[handle.index]
        if address in (self._book().get("gone") or {}):
            raise NVMLError(GPU_IS_LOST)
        return address

    # -- the library --

    def nvmlInit(self) -> None:  # noqa: N802
        listed = self._book().get("gpus")
        self.addresses = (
            [g["address"] for g in sorted(listed, key=lambda g: g["index"])]
            if listed
            else [g.address for g in tree_gpus(Path(self.fs.root))]
        )

    def nvmlShutdown(self) -> None: ...  # noqa: N802

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self._driver()

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.addresses)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:  # noqa: N802
        handle = Handle(index)
        self._address(handle)
        return handle

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:  # noqa: N802
        domain, bus, rest = self._address(handle).split(":")
        return SimpleNamespace(busId=f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}".encode())

    def nvmlDeviceGetTemperature(self, handle: Any, _sensor: int) -> int:  # noqa: N802
        self._address(handle)
        return 40

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:  # noqa: N802
        self._address(handle)
        return (0, 0, 0, 0)

    def nvmlDeviceGetFieldValues(self, handle: Any, fields: list[int]) -> list[Any]:  # noqa: N802
        self._address(handle)
        action = None  # NOT_SUPPORTED: a driver before 565 keeps no recovery action
        if recovery.supported(self._driver()):
            xids = self._book().get("xids") or []
            action = recovery.of_xids(x["xid"] for x in xids if x["gpu"] == handle.index)
        out = []
        for wanted in fields:
            known = wanted == RECOVERY_FIELD and action is not None
            out.append(
                SimpleNamespace(
                    fieldId=wanted,
                    nvmlReturn=SUCCESS if known else NOT_SUPPORTED,
                    value=SimpleNamespace(uiVal=action if known else 0),
                )
            )
        return out

    # -- events --

    def nvmlEventSetCreate(self) -> EventSet:  # noqa: N802
        """A set that gets what the driver logs from now on (after the kernel log's last record)."""
        return EventSet(int(self._book().get("boots", 0)), last_seq(self.fs.resolve(KMSG)))

    def nvmlEventSetFree(self, _: EventSet) -> None: ...  # noqa: N802

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:  # noqa: N802
        self._address(handle)
        return XID_EVENT | DBE_EVENT

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, events: EventSet) -> None:  # noqa: N802
        self._address(handle)
        events.registered[handle.index] = mask

    def nvmlEventSetWait_v2(self, events: EventSet, _timeout_ms: int) -> Any:  # noqa: N802
        """The next Xid logged since the set's last one, on a GPU registered for Xid events."""
        book = self._book()
        if int(book.get("boots", 0)) != events.boots:  # a new boot: its kernel log numbers from 0 again
            events.boots, events.seq = int(book.get("boots", 0)), -1
        for record in sorted(book.get("xids") or [], key=lambda x: x.get("seq", -1)):
            seq = record.get("seq", -1)
            if seq <= events.seq:
                continue
            events.seq = seq
            if events.registered.get(record["gpu"], 0) & XID_EVENT:
                return SimpleNamespace(
                    device=Handle(record["gpu"]),
                    eventType=XID_EVENT,
                    eventData=record["xid"],
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        raise NVMLError(TIMEOUT)
