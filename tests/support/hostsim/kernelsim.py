"""A small, honest model of the kernel's PCI sysfs writes over a fixture host root (a SysfsWriter)."""

from __future__ import annotations

import errno
import fnmatch
import os

from gpu_operator.node.host import pci
from gpu_operator.node.host.holders import gpu_holders
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import hosttree as sysfs

# What each driver's id table matches, as vendor:device:class globs. vfio-pci has no table of
# its own: it only takes devices through driver_override or new_id, as in the kernel.
DEFAULT_MATCHES: dict[str, list[str]] = {
    "nvidia": ["10de:*:03*", "10de:*:0680*"],
    "nouveau": ["10de:*:03*"],
    "snd_hda_intel": ["*:*:0403*"],
    "pcieport": ["*:*:0604*"],
    "nvme": ["*:*:0108*"],
    "mlx5_core": ["15b3:*:02*"],
    "vfio-pci": [],
}
DRIVERS = "/sys/bus/pci/drivers"
# Modules modprobe loads along with a driver: its dependencies, and the vfio core's soft
# dependency on its IOMMU backend ("post: vfio_iommu_type1"), which VMs need to map memory.
MODULES_WITH: dict[str, list[str]] = {"vfio-pci": ["vfio", "vfio_iommu_type1", "vfio_pci_core"]}


class SimulatedHang(OSError):
    """The real kernel would block this write forever (a process holds the GPU): fail loudly instead."""


def _err(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)}: {what}")


class KernelSimulator:
    """Gives sysfs writes their kernel meaning: unbind drops the driver link, drivers_probe binds per
    driver_override or id table, bind to a driver that is not loaded fails with ENOENT, and so on."""

    def __init__(self, fs: HostFS, extra_matches: dict[str, list[str]] | None = None) -> None:
        self.fs = fs
        self.matches = {**DEFAULT_MATCHES, **(extra_matches or {})}
        self.dynamic_ids: dict[str, list[str]] = {}
        self.log: list[tuple[str, str]] = []

    # -- the SysfsWriter seam --------------------------------------------------------------

    def write(self, path: str, value: str) -> None:
        self.log.append((path, value))
        real = self.fs.canonical(path)
        if not self.fs.exists(real):
            raise _err(errno.ENOENT, path)
        arg = value.strip()
        parts = real.split("/")
        if real == "/sys/bus/pci/drivers_probe":
            return self._probe(self._device(arg))
        if real.endswith("/driver_override") and self.fs.is_file(real.rsplit("/", 1)[0] + "/vendor"):
            self.fs.write_text(real, f"{arg or '(null)'}\n")
            return None
        if len(parts) == 7 and real.startswith(DRIVERS + "/"):
            driver, attr = parts[5], parts[6]
            if attr == "unbind":
                return self._unbind(driver, self._device(arg))
            if attr == "bind":
                return self._bind(driver, self._device(arg))
            if attr == "new_id":
                return self._new_id(driver, arg)
        raise _err(errno.EPERM, f"the simulator does not model writes to {real}")

    # -- module loading (what `modprobe` does to sysfs) -------------------------------------

    def load_driver(self, name: str) -> None:
        """Register a driver: it appears under /sys/bus/pci/drivers and probes unbound devices."""
        if self.fs.exists(f"{DRIVERS}/{name}"):
            return
        sysfs.add_driver(self.fs, name)
        modules = self.fs.read_text("/proc/modules") or ""
        loaded = {line.split()[0] for line in modules.splitlines() if line.strip()}
        for module in [*MODULES_WITH.get(name, []), name.replace("-", "_")]:
            if module not in loaded:
                modules += f"{module} 16384 0 - Live 0x0\n"
        self.fs.write_text("/proc/modules", modules)
        for address in self.fs.listdir(pci.PCI_DEVICES):
            if self.fs.link_name(f"{pci.PCI_DEVICES}/{address}/driver") is None and self._matches(
                name, address
            ):
                self._attach(name, address)

    # -- kernel behaviour -------------------------------------------------------------------

    def _device(self, address: str) -> str:
        if not address or not self.fs.is_dir(f"{pci.PCI_DEVICES}/{address}"):
            raise _err(errno.ENODEV, f"no PCI device {address!r}")
        return address

    def _matches(self, driver: str, address: str) -> bool:
        func = pci.read_function(self.fs, address)
        if func.driver_override:
            return func.driver_override == driver
        key = f"{func.vendor}:{func.device}:{func.pci_class}"
        patterns = self.matches.get(driver, []) + self.dynamic_ids.get(driver, [])
        return any(fnmatch.fnmatch(key, p) for p in patterns)

    def _probe(self, address: str) -> None:
        if self.fs.link_name(f"{pci.PCI_DEVICES}/{address}/driver"):
            return  # already bound: the kernel leaves it alone
        for driver in self.fs.listdir(DRIVERS):
            if self._matches(driver, address):
                self._attach(driver, address)
                return

    def _bind(self, driver: str, address: str) -> None:
        if self.fs.link_name(f"{pci.PCI_DEVICES}/{address}/driver"):
            raise _err(errno.EBUSY, f"{address} is already bound")
        if not self._matches(driver, address):
            raise _err(errno.ENODEV, f"{driver} does not match {address}")
        self._attach(driver, address)

    def _unbind(self, driver: str, address: str) -> None:
        if self.fs.link_name(f"{pci.PCI_DEVICES}/{address}/driver") != driver:
            raise _err(errno.ENODEV, f"{address} is not bound to {driver}")
        if driver == "nvidia":
            busy = [h for h in gpu_holders(self.fs) if h.address == address]
            if busy:
                raise SimulatedHang(
                    errno.EBUSY,
                    f"unbinding {address} from nvidia would hang: held by "
                    + ", ".join(f"{h.comm}[{h.pid}]" for h in busy),
                )
            self.fs.remove(f"/proc/driver/nvidia/gpus/{address}/information")
        dev_dir = self.fs.canonical(f"{pci.PCI_DEVICES}/{address}")
        self.fs.remove(f"{dev_dir}/driver")
        self.fs.remove(f"{DRIVERS}/{driver}/{address}")

    def _attach(self, driver: str, address: str) -> None:
        dev_dir = self.fs.canonical(f"{pci.PCI_DEVICES}/{address}")
        sysfs.rel_symlink(self.fs, f"{dev_dir}/driver", f"{DRIVERS}/{driver}")
        sysfs.rel_symlink(self.fs, f"{DRIVERS}/{driver}/{address}", dev_dir)
        if driver == "nvidia" and pci.read_function(self.fs, address).is_gpu:
            used = {m for m in self._minors()}
            minor = next(i for i in range(len(used) + 1) if i not in used)
            sysfs.write_gpu_information(self.fs, address, minor, "simulated")

    def _minors(self) -> list[int]:
        from gpu_operator.node.host.holders import device_minors

        return list(device_minors(self.fs))

    def _new_id(self, driver: str, arg: str) -> None:
        words = arg.split()
        if len(words) < 2:
            raise _err(errno.EINVAL, f"new_id wants 'vendor device', got {arg!r}")
        self.dynamic_ids.setdefault(driver, []).append(f"{words[0].lower()}:{words[1].lower()}:*")
        for address in self.fs.listdir(pci.PCI_DEVICES):
            if self.fs.link_name(f"{pci.PCI_DEVICES}/{address}/driver") is None and self._matches(
                driver, address
            ):
                self._attach(driver, address)
