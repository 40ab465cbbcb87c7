"""GPU faults played on a node's host tree (`gpu-operator sim fault`), as the kernel and NVIDIA's
driver leave them on a real host, so that whatever reads the host (our health agent, the
device-plugin stand-in) sees what it would see there.

- `xid`: the driver's Xid record appended to the tree's kernel log (/dev/kmsg, a regular file in
  kmsg's record format `PRIORITY,SEQ,MICROSECONDS,-;MESSAGE`). The message is the driver's:
  `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., GPU has fallen off the bus.` (NVIDIA's Xid
  catalogue, docs.nvidia.com/deploy/xid-errors; the address is domain:bus:device, no function).
  On a driver from 565, an Xid that changes the GPU's recovery action is followed by the driver's
  Xid 154 record (`sim/hardware/recovery.py`; NVML reads the action through `sim/hardware/nvmltree.py`).
- `gone`: the GPU fell off the bus: the Xid 79 record and the driver's `NVRM: GPU 0000:3b:00.0: GPU
  has fallen off the bus.` line, then the card is gone as after a PCIe surprise removal: its
  functions leave sysfs (/sys/devices/..., /sys/bus/pci/devices, its driver's and IOMMU group's
  links), the driver drops /proc/driver/nvidia/gpus/<address> and its /dev/nvidia<minor> node.
  What was removed is kept outside the tree (the fault book), to be put back.
- `reset` (no command: the health agent's stand-in plays `nvidia-smi -r` with it): one GPU still
  on the bus forgets its Xids of this boot; the boot, a gone GPU and other GPUs' faults stay.
- `clear`: the fix that clears every fault, a reboot (power cycle) of the host: every removed GPU
  is back as it was, the kernel log starts empty, /run (kured's reboot sentinel) is emptied and the
  boot gets a new /proc/sys/kernel/random/boot_id. Whatever reads the host tells the new boot by that boot_id; the
  node's agents start afresh, as their pods do after a reboot.
- `reboot` of a vGPU host (`reboot_vgpu_host`): `clear`, and the vGPU manager's state a reboot
  loses (the VFs, their vGPUs, MIG mode on Hopper: `sim/hardware/vgpuhw.py`) and /run/nvidia/validations;
  `sim/commands/faultinject.py` then ends the node's pods as its kubelet's shutdown does.

A GPU is named by its index as NVML numbers them (PCI address order) on the intact host: the fault
book records the intact host's GPUs the first time the tree is touched, so an index keeps naming
the same GPU while another one is gone.

Where the trees are: a kwok node's under the simulator's `hosts/<node>/root`, made from its shape
when a fault is first injected (until then the node's agents read a tree shared by its shape,
`sim/standins/health.py`); every change is announced by a line in `hosts/changes`, which the stand-ins
follow. The real node's is its own host tree (`real-node-host`), its book beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import devnodes, hosttree, recovery
from gpu_operator.sim.realnode.toolkit import gpus as tree_gpus
from gpu_operator.vocabulary import VALIDATIONS_DIR

KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
PROC_STAT = "/proc/stat"
BOOK = "faults.json"
CHANGES = "changes"
XID_OFF_BUS = 79
VALIDATED = ("driver", "toolkit", "cuda", "plugin")  # the validator pod's init containers' checks
MAX_XID = 1023  # NVIDIA's catalogue numbers stay well below; anything above is a typo
# kmsg priority of the driver's NVRM lines: facility kern (0), level err (3)
PRIORITY = 3


class FaultError(ValueError):
    """A fault cannot be injected as asked; the message names the field and the fix."""


@dataclass
class GpuRecord:
    index: int
    address: str  # domain:bus:device.function
    minor: int
    uuid: str

    @property
    def xid_address(self) -> str:
        """The address as the driver's Xid line writes it: domain:bus:device."""
        return self.address.rsplit(".", 1)[0]


@dataclass
class Book:
    """What the faults did to one tree, kept outside it (the host carries none of this)."""

    gpus: list[GpuRecord]
    boot_started: float = field(default_factory=time.time)
    # address -> what `gone` took away: {"moved": {host path: stash dir}, "links": {host path: target},
    #                                    "nodes": {host path: [major, minor]}}
    gone: dict[str, dict[str, Any]] = field(default_factory=dict)
    # {"gpu", "xid", "seq": its kernel-log record's sequence number} injected this boot
    xids: list[dict[str, Any]] = field(default_factory=list)
    boots: int = 0  # reboots played by `clear`


def xid_message(address: str, xid: int) -> str:
    """The driver's Xid line for `address` (domain:bus:device)."""
    tail = ", GPU has fallen off the bus." if xid == XID_OFF_BUS else ""
    return f"NVRM: Xid (PCI:{address}): {xid}, pid='<unknown>', name=<unknown>{tail}"


def parse_xid(raw: str | int) -> int:
    text = str(raw).strip()
    if not text.isdigit() or not 0 < int(text) <= MAX_XID:
        raise FaultError(
            f"--xid {raw!r}: give the Xid as a whole number from 1 to {MAX_XID}, e.g. --xid 79 "
            "(the numbers are NVIDIA's Xid catalogue)"
        )
    return int(text)


class HostFaults:
    """The faults of one host tree (`root`), with its book in `book_dir` (outside the tree)."""

    def __init__(self, root: Path, book_dir: Path) -> None:
        self.root, self.book_dir = Path(root), Path(book_dir)
        self.fs = HostFS(self.root)

    # -- the book --

    @property
    def book_path(self) -> Path:
        return self.book_dir / BOOK

    def book(self) -> Book:
        try:
            raw = json.loads(self.book_path.read_text())
        except FileNotFoundError:
            found = [GpuRecord(g.index, g.address, g.minor, g.uuid) for g in tree_gpus(self.root)]
            book = Book(found)
            if not self.fs.exists(BOOT_ID):
                self.fs.write_text(BOOT_ID, f"{uuid.uuid4()}\n")
            self.save(book)
            return book
        raw["gpus"] = [GpuRecord(**g) for g in raw["gpus"]]
        return Book(**raw)

    def save(self, book: Book) -> None:
        self.book_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.book_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(book), indent=2))
        tmp.replace(self.book_path)

    def gpu(self, book: Book, index: int | None) -> GpuRecord:
        if not book.gpus:
            raise FaultError(f"this host has no GPU on NVIDIA's driver ({self.root}): choose a GPU node")
        chosen = 0 if index is None else index
        if not 0 <= chosen < len(book.gpus):
            raise FaultError(
                f"--gpu {index}: this host has {len(book.gpus)} GPU(s): give an index from 0 to "
                f"{len(book.gpus) - 1} (NVML's order, by PCI address)"
            )
        return book.gpus[chosen]

    # -- the kernel log --

    def kmsg_append(self, book: Book, messages: list[str]) -> int:
        """Append the driver's records; the sequence number of the first."""
        path = self.fs.resolve(KMSG)
        seq = last_seq(path) + 1
        usec = int((time.time() - book.boot_started) * 1e6)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            for i, message in enumerate(messages):
                out.write(f"{PRIORITY},{seq + i},{usec},-;{message}\n")
        return seq

    def _recorded(self, book: Book, gpu: GpuRecord, xid: int, messages: list[str]) -> None:
        """The Xid's records in the kernel log and the book (with the record's sequence number, for
        NVML's events: `sim/hardware/nvmltree.py`); where the driver keeps a recovery action (565 and later)
        and the Xid changes this GPU's, the driver's Xid 154 record after them (`sim/hardware/recovery.py`)."""
        before = recovery.of_xids(x["xid"] for x in book.xids if x["gpu"] == gpu.index)
        after = recovery.strongest((before, recovery.for_xid(xid)))
        if after != before and recovery.supported(recovery.driver_version(self.fs)):
            messages = [*messages, recovery.changed_line(gpu.xid_address, before, after)]
        book.xids.append({"gpu": gpu.index, "xid": xid, "seq": self.kmsg_append(book, messages)})

    # -- the faults --

    def xid(self, xid: int, index: int | None = None) -> GpuRecord:
        book = self.book()
        gpu = self.gpu(book, index)
        self._recorded(book, gpu, xid, [xid_message(gpu.xid_address, xid)])
        self.save(book)
        return gpu

    def gone(self, index: int | None = None) -> GpuRecord:
        book = self.book()
        gpu = self.gpu(book, index)
        if gpu.address in book.gone:
            raise FaultError(
                f"--gone: GPU {gpu.index} ({gpu.address}) is already off the bus: --clear brings it back"
            )
        self._recorded(
            book,
            gpu,
            XID_OFF_BUS,
            [
                xid_message(gpu.xid_address, XID_OFF_BUS),
                f"NVRM: GPU {gpu.address}: GPU has fallen off the bus.",
            ],
        )
        book.gone[gpu.address] = self._remove(gpu)
        self.save(book)
        return gpu

    def _remove(self, gpu: GpuRecord) -> dict[str, Any]:
        fs, slot = self.fs, gpu.xid_address
        stash = self.book_dir / "stash" / gpu.address
        if stash.exists():
            shutil.rmtree(stash)
        stash.mkdir(parents=True)
        taken: dict[str, Any] = {"moved": {}, "links": {}, "nodes": {}}
        functions = sorted(name for name in fs.listdir("/sys/bus/pci/devices") if name.startswith(f"{slot}."))
        for i, address in enumerate(functions):
            link = f"/sys/bus/pci/devices/{address}"
            dev_dir = fs.canonical(link)
            for sub in ("driver", "iommu_group"):
                target = fs.resolve(f"{dev_dir}/{sub}")
                if fs.resolve(f"{dev_dir}/{sub}", follow_last=False).is_symlink():
                    back = f"{fs.host_path(target)}/{'devices/' if sub == 'iommu_group' else ''}{address}"
                    self._take_link(back, taken)
            self._take_link(link, taken)
            self._move(dev_dir, stash / f"sysfs-{i}", taken)
        proc = f"/proc/driver/nvidia/gpus/{gpu.address}"
        if fs.exists(proc):
            self._move(proc, stash / "procfs", taken)
        dev = f"/dev/nvidia{gpu.minor}"
        found = devnodes.char_device(fs.resolve(dev))
        if found is not None:
            taken["nodes"][dev] = list(found)
            fs.resolve(dev).unlink()
        return taken

    def _take_link(self, host_path: str, taken: dict[str, Any]) -> None:
        real = self.fs.resolve(host_path, follow_last=False)
        if real.is_symlink():
            taken["links"][host_path] = os.readlink(real)
            real.unlink()

    def _move(self, host_path: str, to: Path, taken: dict[str, Any]) -> None:
        shutil.move(str(self.fs.resolve(host_path)), to)
        taken["moved"][host_path] = str(to)

    def reset(self, address: str) -> GpuRecord:
        """A GPU reset (`nvidia-smi -r`) of one GPU still on the bus: its Xids of this boot are
        forgotten (the book), the boot and the other GPUs' faults stay; a GPU gone from the bus
        cannot be reset (only `clear`, a reboot, brings it back)."""
        book = self.book()
        gpu = next((g for g in book.gpus if g.address == address), None)
        if gpu is None:
            raise FaultError(
                f"GPU {address}: not a GPU of this host ({', '.join(g.address for g in book.gpus)})"
            )
        if address in book.gone:
            raise FaultError(
                f"GPU {gpu.index} ({address}) is off the bus: a reset cannot reach it; --clear (a "
                "reboot) brings it back"
            )
        book.xids = [x for x in book.xids if x["gpu"] != gpu.index]
        self.kmsg_append(book, [f"NVRM: GPU at PCI:{address}: GPU reset"])
        self.save(book)
        return gpu

    def clear(self) -> Book:
        """Reboot the host: removed GPUs back, an empty kernel log, a new boot_id."""
        book = self.book()
        for taken in book.gone.values():
            for host_path, stash in taken["moved"].items():
                real = self.fs.resolve(host_path, follow_last=False)
                real.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(stash, real)
            for host_path, target in taken["links"].items():
                self.fs.symlink(host_path, target)
            for host_path, (major, minor) in taken["nodes"].items():
                devnodes.make_char(self.fs.resolve(host_path), major, minor)
        shutil.rmtree(self.book_dir / "stash", ignore_errors=True)
        self.fs.resolve(KMSG).parent.mkdir(parents=True, exist_ok=True)
        self.fs.resolve(KMSG).write_text("")
        self.fs.write_text(BOOT_ID, f"{uuid.uuid4()}\n")
        self.fs.write_text(
            PROC_STAT, f"btime {int(time.time())}\n"
        )  # the kernel's boot time (its line of /proc/stat)
        for run_dir in ("/run", "/var/run"):  # a tmpfs: the reboot empties it (kured's sentinel too)
            self.fs.remove(f"{run_dir}/reboot-required")
        book.gone, book.xids, book.boots, book.boot_started = {}, [], book.boots + 1, time.time()
        self.save(book)
        return book

    def reboot_vgpu_host(self, spec: dict[str, Any]) -> Book:
        """Reboot a vGPU host (`spec`: its host as built, with the vGPU host model): what `clear`
        does, and what the vGPU manager's state loses (`vgpuhw.VgpuHostSim.reboot`: the VFs and their
        vGPUs, VM processes, MIG mode unless the GPU keeps it), and /run/nvidia/validations emptied
        (a tmpfs: the status files of the validators' checks, the vGPU host state's among them)."""
        from gpu_operator.sim.hardware.vgpuhw import VGPU_STATE, VgpuHostSim, is_vgpu_host

        if not is_vgpu_host(spec):
            raise FaultError(f"{self.root}: not a vGPU host (no vGPU host model for its shape)")
        book = self.clear()
        VgpuHostSim(self.fs, spec, self.book_dir / VGPU_STATE).reboot()
        for name in self.fs.listdir(VALIDATIONS_DIR):
            self.fs.remove(f"{VALIDATIONS_DIR}/{name}")
        return book


def last_seq(kmsg: Path) -> int:
    """The sequence number of the last record in a kmsg-format file (-1 when empty or absent)."""
    try:
        with kmsg.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return -1
    for line in reversed(tail.splitlines()):
        head = line.partition(";")[0].split(",")
        if len(head) >= 2 and head[1].isdigit():
            return int(head[1])
    return -1


def boot_id(fs: HostFS) -> str:
    return (fs.read_text(BOOT_ID) or "").strip()


# -- the simulator's per-node trees --


def node_host_spec(shape: str) -> dict[str, Any]:
    """The host of a kwok node of `shape` (`realspec.host_spec`) with NVIDIA's driver loaded: where
    the operator's driver container installs it (no host driver, no vfio-pci) its modules are
    loaded, the GPUs bound and its device nodes made, as the driver container leaves the host.
    Every component that reads these trees (our health agent in the validator pod, the toolkit,
    the MIG manager, the vGPU host state) starts only after the driver's validation passed on the
    node, so none of them can see a host without the driver. No validator status file is there:
    /run/nvidia/validations holds only what a validator pod wrote on this node (`validator_wrote`),
    and a tree made while none ran (a fault injected before the operator deployed) has none. Like
    every host it has a kernel log (/dev/kmsg, empty: nothing happened yet) and a boot_id (one per
    shape, so a node's own tree, made at its first fault, reads as the same boot as the tree it
    shared)."""
    from gpu_operator.sim.realnode.realspec import HOST_DRIVER_VERSION, host_spec

    spec = host_spec(shape)
    spec["files"].update(
        {KMSG: "", BOOT_ID: f"{uuid.uuid5(uuid.NAMESPACE_URL, f'gpu-operator-sim-boot:{shape}')}\n"}
    )
    if not spec["pci_drivers"]:
        spec["pci_drivers"] = ["nvidia"]
        spec["modules"] = [*spec["modules"], "nvidia", "nvidia_uvm", "nvidia_modeset"]
        spec["driver_version"] = HOST_DRIVER_VERSION
        for device in spec["devices"]:
            if device["vendor"] == "10de" and str(device["class"]).startswith(
                "03"
            ):  # a VM guest's other devices keep theirs
                device["driver"] = "nvidia"
    return spec


def validator_wrote(fs: HostFS, names: Iterable[str] = VALIDATED, when: float | None = None) -> None:
    """The validator pod's init containers passed on this host: the status files of their checks
    `names` (empty: nothing reads their content but the validator). `when` (epoch seconds): what a
    pod that started then wrote, dated then; a file already there keeps its time. None: written
    now, as a new pod's checks do (what the validation after a remediation action waits for)."""
    from gpu_operator.node.validate.config import STATUS_FILES

    for name in names:
        path = f"{VALIDATIONS_DIR}/{STATUS_FILES[name]}"
        if when is not None and fs.exists(path):
            continue
        fs.write_text(path, "")
        if when is not None:
            os.utime(fs.resolve(path), (when, when))


class NodeHosts:
    """The kwok nodes' own host trees under `base` (<sim dir>/hosts): `<node>/root` the tree,
    `<node>/` its fault book; `changes` one line per fault, for the stand-ins to follow."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)

    def root(self, node: str) -> Path:
        return self.base / node / "root"

    def has(self, node: str) -> bool:
        return self.root(node).is_dir()

    def faults(self, node: str, spec: dict[str, Any] | None = None) -> HostFaults:
        """The node's tree and book; built from `spec` (its shape's host) if it has none yet."""
        root = self.root(node)
        if not root.is_dir():
            if spec is None:
                raise FaultError(f"node {node} has no host tree of its own yet")
            building = root.with_name("root.building")
            shutil.rmtree(building, ignore_errors=True)
            hosttree.build(spec, building)
            building.rename(root)
        return HostFaults(root, root.parent)

    def has_faults(self, node: str) -> bool:
        """Whether the node's tree holds a fault not cleared yet (its book says)."""
        try:
            raw = json.loads((self.base / node / BOOK).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return bool(raw.get("xids") or raw.get("gone"))

    def gpus(self, node: str) -> list[GpuRecord]:
        """The node's GPUs as its book recorded them on the intact host ([] without a tree)."""
        try:
            raw = json.loads((self.base / node / BOOK).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return []
        return [GpuRecord(**g) for g in raw.get("gpus") or []]

    def announce(self, node: str) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        with (self.base / CHANGES).open("a") as out:
            out.write(f"{node}\n")


class ChangeFollower:
    """Follows `hosts/changes`: `poll()` returns the nodes announced since the last call (one stat
    when nothing changed)."""

    def __init__(self, base: Path) -> None:
        self.path = Path(base) / CHANGES
        self.offset = self._size()  # what was announced before we started is in the trees already

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def poll(self) -> list[str]:
        size = self._size()
        if size == self.offset:
            return []
        if size < self.offset:
            self.offset = 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next poll
        self.offset += end
        return list(dict.fromkeys(line for line in data[:end].decode(errors="replace").splitlines() if line))


async def follow_changes(follower: ChangeFollower, interval: float, wake: Callable[[str], None]) -> None:
    """Call `wake(node)` for each node announced since `follower` was made (one stat per
    `interval` while nothing is announced). Make the follower when the caller starts, not when
    this task first runs: what is announced in between would be missed."""
    while True:
        for node in follower.poll():
            wake(node)
        await asyncio.sleep(interval)
