"""Host trees built from data: a real sysfs layout (device directories, driver and IOMMU group
links, attribute files), procfs files and host files under a directory, as the node agents read
them through `HostFS`. The node-agent tests build their fixtures with it (tests/fixtures/hosts),
the real node its host tree (see `realspec.host_spec`).

A spec: os {id, version_id}, kernel, cmdline, modules, pci_drivers, driver_version, devices
[{address(es), vendor, device, class, driver, functions, iommu_group, parent, config, ...}], files,
executables, symlinks, processes; `iommu: false` for a host without IOMMU groups; `root_port:
{vendor, device}` for the root ports the builder adds above devices (a QEMU q35 guest's are
1b36:000c, see `guesttree`); a device's `config` is its PCI configuration space in hex.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import devnodes

_BRIDGE_VENDOR = "8086"
_BRIDGE_CLASS = "060400"


class HostSpecError(ValueError):
    """A host fixture is malformed; the message names the field and the fix."""


@dataclass
class _Function:
    address: str
    vendor: str
    device: str
    pci_class: str
    driver: str | None
    driver_override: str | None
    numa_node: int
    group: int | None
    parent: str
    extra: dict[str, str] = field(default_factory=dict)
    physfn: str | None = None
    config: bytes | None = None  # the `config` file: the PCI configuration space


def _bus(address: str) -> str:
    return address.split(":")[1]


def _functions(spec: dict[str, Any]) -> list[_Function]:
    out: list[_Function] = []
    group = int(spec.get("iommu_group_base", 10))
    iommu = bool(spec.get("iommu", True))
    for index, entry in enumerate(spec.get("devices") or []):
        where = f"devices[{index}]"
        addresses = entry.get("addresses") or ([entry["address"]] if "address" in entry else None)
        if not addresses:
            raise HostSpecError(f"{where}: give `address` or `addresses` (e.g. 0000:0a:00.0)")
        for key in ("vendor", "device", "class"):
            if key not in entry:
                raise HostSpecError(f"{where}: `{key}` is required (hex, e.g. vendor: '10de')")
        for raw in addresses:
            address = str(raw).lower()
            if not isinstance(raw, str) or address.count(":") != 2 or "." not in address:
                raise HostSpecError(
                    f"{where}: address {address!r} must look like 0000:0a:00.0 (quote it in YAML: unquoted 0000:41:00.0 reads as a number)"
                )
            bus = _bus(address)
            numa = entry.get("numa_node", "auto")
            numa_node = (0 if int(bus, 16) < 0x80 else 1) if numa == "auto" else int(numa)
            fixed_group = entry.get("iommu_group", "auto")
            this_group = None
            if iommu:
                if fixed_group == "auto":
                    this_group, group = group, group + 1
                else:
                    this_group = int(fixed_group)
            parent = entry.get("parent") or f"pci0000:{bus}/0000:{bus}:01.0"
            out.append(
                _Function(
                    address,
                    str(entry["vendor"]).lower(),
                    str(entry["device"]).lower(),
                    str(entry["class"]).lower(),
                    entry.get("driver"),
                    entry.get("driver_override"),
                    numa_node,
                    this_group,
                    parent,
                    {str(k): str(v) for k, v in (entry.get("attributes") or {}).items()},
                    entry.get("physfn"),
                    _config(entry, where),
                )
            )
            slot = address.rsplit(".", 1)[0]
            for sub in entry.get("functions") or []:
                out.append(
                    _Function(
                        f"{slot}.{sub['function']}",
                        str(sub.get("vendor", entry["vendor"])).lower(),
                        str(sub["device"]).lower(),
                        str(sub["class"]).lower(),
                        sub.get("driver"),
                        sub.get("driver_override"),
                        numa_node,
                        this_group,  # functions of one card share its IOMMU group
                        parent,
                    )
                )
    return out


def _config(entry: dict[str, Any], where: str) -> bytes | None:
    raw = entry.get("config")
    if raw is None:
        return None
    try:
        return bytes.fromhex(str(raw))
    except ValueError:
        raise HostSpecError(
            f"{where}: `config` is the PCI configuration space in hex (e.g. 'de103023...')"
        ) from None


def _bridges(
    functions: list[_Function], iommu: bool, port: tuple[str, str] = (_BRIDGE_VENDOR, "1bbf")
) -> list[_Function]:
    bridges: dict[str, _Function] = {}
    group = 0
    for func in functions:
        bridge_addr = func.parent.rsplit("/", 1)[-1]
        if bridge_addr.startswith("pci") or bridge_addr in bridges:
            continue
        bridges[bridge_addr] = _Function(
            bridge_addr,
            *port,
            _BRIDGE_CLASS,
            "pcieport",
            None,
            func.numa_node,
            group if iommu else None,
            func.parent.rsplit("/", 1)[0],
        )
        group += 1
    return list(bridges.values())


def _write_function(fs: HostFS, func: _Function) -> None:
    dev_dir = f"/sys/devices/{func.parent}/{func.address}"
    fs.mkdir(dev_dir)
    attrs = {
        "vendor": f"0x{func.vendor}\n",
        "device": f"0x{func.device}\n",
        "class": f"0x{func.pci_class}\n",
        "numa_node": f"{func.numa_node}\n",
        "driver_override": f"{func.driver_override or '(null)'}\n",
        **{k: f"{v}\n" for k, v in func.extra.items()},
    }
    for name, value in attrs.items():
        fs.write_text(f"{dev_dir}/{name}", value)
    if func.config is not None:
        fs.resolve(f"{dev_dir}/config").write_bytes(func.config)
    rel_symlink(fs, f"/sys/bus/pci/devices/{func.address}", dev_dir)
    if func.physfn:
        rel_symlink(fs, f"{dev_dir}/physfn", fs.canonical(f"/sys/bus/pci/devices/{func.physfn}"))
    if func.group is not None:
        group_dir = f"/sys/kernel/iommu_groups/{func.group}"
        fs.mkdir(f"{group_dir}/devices")
        rel_symlink(fs, f"{dev_dir}/iommu_group", group_dir)
        rel_symlink(fs, f"{group_dir}/devices/{func.address}", dev_dir)
    if func.driver:
        add_driver(fs, func.driver)
        rel_symlink(fs, f"{dev_dir}/driver", f"/sys/bus/pci/drivers/{func.driver}")
        rel_symlink(fs, f"/sys/bus/pci/drivers/{func.driver}/{func.address}", dev_dir)


def _module_line(name: str) -> str:
    return f"{name.replace('-', '_')} 16384 0 - Live 0x0000000000000000\n"


def build(spec: dict[str, Any], root: str | os.PathLike[str]) -> HostFS:
    """Create the host root described by `spec` under `root` (which should be empty)."""
    fs = HostFS(Path(root))
    os_ = spec.get("os") or {}
    fs.write_text(
        "/etc/os-release",
        f'ID={os_.get("id", "ubuntu")}\nVERSION_ID="{os_.get("version_id", "")}"\n'
        f'PRETTY_NAME="{os_.get("pretty", os_.get("id", "Linux"))}"\n',
    )
    fs.write_text("/proc/sys/kernel/osrelease", f"{spec.get('kernel', '6.8.0-generic')}\n")
    fs.write_text("/proc/cmdline", f"{spec.get('cmdline', 'BOOT_IMAGE=/vmlinuz ro quiet')}\n")
    fs.write_text("/sys/bus/pci/drivers_probe", "")
    fs.write_text("/sys/bus/pci/drivers_autoprobe", "1\n")
    fs.mkdir("/sys/kernel/iommu_groups")
    iommu = bool(spec.get("iommu", True))
    functions = _functions(spec)
    port = spec.get("root_port") or {}
    ids = (str(port.get("vendor", _BRIDGE_VENDOR)).lower(), str(port.get("device", "1bbf")).lower())
    for func in _bridges(functions, iommu, ids) + functions:
        _write_function(fs, func)
    drivers = set(spec.get("pci_drivers") or [])
    for name in sorted(drivers):
        add_driver(fs, name)
    loaded = {f.driver for f in functions if f.driver} | drivers | set(spec.get("modules") or [])
    loaded.discard("pcieport")  # built into the kernel, never a module
    fs.write_text("/proc/modules", "".join(_module_line(m) for m in sorted(loaded)))
    version = spec.get("driver_version")
    if "nvidia" in loaded and version:
        fs.write_text(
            "/proc/driver/nvidia/version",
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Release Build  (dvs-builder@fixture)\n",
        )
        nvidia = [f for f in functions if f.driver == "nvidia" and f.pci_class.startswith("03")]
        for minor, func in enumerate(nvidia):
            write_gpu_information(fs, func.address, minor, version)
        # the character devices the driver creates, and its majors in /proc/devices
        for path, (major, minor) in devnodes.driver_nodes(loaded, list(range(len(nvidia)))).items():
            devnodes.make_char(fs.resolve(path), major, minor)
        fs.write_text("/proc/devices", devnodes.proc_devices(loaded))
    vfio_groups = [f.group for f in functions if f.driver == "vfio-pci" and f.group is not None]
    for path, (major, minor) in devnodes.vfio_nodes(vfio_groups).items():  # VFIO's group devices
        devnodes.make_char(fs.resolve(path), major, minor)
    for path, content in (spec.get("files") or {}).items():
        fs.write_text(path, str(content))
    for path, content in (spec.get("executables") or {}).items():
        fs.write_text(path, str(content))
        fs.resolve(path).chmod(0o755)
    for path, target in (spec.get("symlinks") or {}).items():
        fs.symlink(path, str(target))
    for proc in spec.get("processes") or []:
        pid = int(proc["pid"])
        fs.write_text(f"/proc/{pid}/comm", f"{proc.get('comm', 'proc')}\n")
        fs.mkdir(f"/proc/{pid}/fd")
        for index, device in enumerate(proc.get("fds") or [], start=3):
            # The target is the process's view (/dev/...), deliberately left unresolved.
            fs.resolve(f"/proc/{pid}/fd", follow_last=True).joinpath(str(index)).symlink_to(device)
    return fs


# -- sysfs and procfs primitives (the tests' kernel simulator writes through these too) --


def rel_symlink(fs: HostFS, link: str, target: str) -> None:
    """A relative symlink as the kernel makes them (sysfs never uses absolute targets)."""
    rel = os.path.relpath(target, os.path.dirname(link))
    fs.symlink(link, rel)


def add_driver(fs: HostFS, name: str) -> None:
    """A loaded PCI driver's sysfs directory (the kernel's attribute files are empty regular files here)."""
    base = f"/sys/bus/pci/drivers/{name}"
    for attr in ("bind", "unbind", "new_id", "remove_id"):
        if not fs.exists(f"{base}/{attr}"):
            fs.write_text(f"{base}/{attr}", "")


def gpu_uuid(address: str) -> str:
    """A GPU's UUID in a tree: stable per PCI address, in NVIDIA's `GPU-<uuid>` form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpu-operator-sim:{address}')}"


def write_gpu_information(fs: HostFS, address: str, minor: int, version: str) -> None:
    fs.write_text(
        f"/proc/driver/nvidia/gpus/{address}/information",
        f"Model:           NVIDIA GPU\nGPU UUID:        {gpu_uuid(address)}\nDevice Minor:    {minor}\n"
        f"Bus Location:    {address}\nDriver:          {version}\n",
    )
