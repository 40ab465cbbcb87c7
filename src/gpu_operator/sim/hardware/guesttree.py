"""Host trees of a KubeVirt VM guest (`hosttree` specs): what a node inside a VM with GPUs given to
it sees, laid out as a QEMU q35 machine under libvirt, the way KubeVirt's virt-launcher defines it.

- Bus 0 holds the q35 chipset (host bridge 8086:29c0, ICH9 LPC/SATA/SMBus at 00:1f.x), the VGA
  device and the PCIe root ports (QEMU's pcie-root-port, 1b36:000c) at 00:02.0-00:02.7, 00:03.0...
  Every PCIe device sits alone behind a root port of its own, on the bus that port opens (libvirt
  gives each device a root port; KubeVirt adds empty ones for hotplug after them): the VM's virtio
  devices first, then the passed-through GPUs, e.g. 0000:06:00.0 and 0000:07:00.0 for two. The
  bus numbers of a real VM depend on its devices; nothing here reads them.
- DMI as KubeVirt sets it by default (kubevirt pkg/virt-config: SMBIOS manufacturer "KubeVirt",
  product "None", family "KubeVirt"): /sys/class/dmi/id/{sys_vendor,product_name,product_family}.
- /proc/cpuinfo with the `hypervisor` flag (CPUID leaf 1, ECX bit 31: set by KVM for its guests).
- No IOMMU groups (a guest has none unless the VM is given a virtual IOMMU), no NVSwitch unless
  asked for (`nvswitches`: the full-passthrough model of NVIDIA's Fabric Manager guide, where a VM
  gets the NVSwitches too), NUMA node -1 (no NUMA topology given to the VM).
- A vGPU guest's GPU carries, in its PCI configuration space, the vendor-specific capability that
  NVIDIA's vGPU manager exposes (signature "VF", then the host driver's version and branch), as GPU
  feature discovery reads it (k8s-device-plugin internal/vgpu); a passed-through GPU has none.

`guest_spec(gpus=N)` is the one builder: any number of H100 SXM5 (the tests use 1, 2 and 8), or `model="h100-pcie"`.
"""

from __future__ import annotations

from typing import Any

from gpu_operator.shapes import DRIVER_VERSION as HOST_DRIVER_VERSION

# model -> (PCI device ID, NVLink through NVSwitches): the SXM5 board's GPUs reach each other only
# through the baseboard's NVSwitches (HGX H100); the PCIe card has no NVSwitch fabric.
MODELS = {"h100-sxm5": ("2330", True), "h100-pcie": ("2331", False)}
NVSWITCH_DEVICE = "22a3"  # GH100 [H100 NVSwitch], a PCI bridge-class (0680) function
ROOT_PORT = {"vendor": "1b36", "device": "000c"}
# The VM's own PCIe devices, each behind its root port before the GPUs (virtio 1.0 IDs).
_VIRTIO = (
    ("1af4", "1041", "020000", "virtio-pci"),  # network
    ("1b36", "000d", "0c0330", "xhci_hcd"),  # USB (tablet)
    ("1af4", "1043", "078000", "virtio-pci"),  # serial console
    ("1af4", "1042", "010000", "virtio-pci"),  # root disk
    ("1af4", "1042", "010000", "virtio-pci"),  # cloud-init disk
)
_CHIPSET = (
    ("0000:00:00.0", "8086", "29c0", "060000", None),
    ("0000:00:01.0", "1234", "1111", "030000", "bochs-drm"),
    ("0000:00:1f.0", "8086", "2918", "060100", "lpc_ich"),
    ("0000:00:1f.2", "8086", "2922", "010601", "ahci"),
    ("0000:00:1f.3", "8086", "2930", "0c0500", "i801_smbus"),
)
# The guest's container runtime: stock containerd, CRI on, runc by default (as realspec's hosts).
_CONTAINERD = {
    "/etc/containerd/config.toml": 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
    '  default_runtime_name = "runc"\n',
    "/run/containerd/containerd.sock": "",
}
KUBEVIRT_DMI = {"sys_vendor": "KubeVirt", "product_name": "None", "product_family": "KubeVirt"}
_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
    "sse2 ss syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid tsc_known_freq "
    "pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand "
    "hypervisor lahf_lm abm 3dnowprefetch avx2 avx512f"
)
# The nvidia module's parameters as /proc/driver/nvidia/params lists them (a few of them).
_NVIDIA_SMI = f"""#!/bin/sh
# The driver container's nvidia-smi in the guest: answers as a driver {HOST_DRIVER_VERSION} would.
echo "NVIDIA-SMI {HOST_DRIVER_VERSION}    Driver Version: {HOST_DRIVER_VERSION}    CUDA Version: 12.4"
"""
_PARAMS = "ResmanDebugLevel: 4294967295\nEnableMSI: 1\nNvLinkDisable: {nvlink}\nEnableGpuFirmware: 18\n"


def root_port(index: int) -> str:
    """The address of the `index`-th root port (1-based): 00:02.0 ... 00:02.7, 00:03.0, ..."""
    slot, function = 2 + (index - 1) // 8, (index - 1) % 8
    return f"0000:00:{slot:02x}.{function}"


def gpu_addresses(gpus: int) -> list[str]:
    """Where `gpus` passed-through GPUs appear in the guest: one bus each, after the virtio devices."""
    first = len(_VIRTIO) + 1
    return [f"0000:{first + i:02x}:00.0" for i in range(gpus)]


def vgpu_config(device: str, host_version: str = HOST_DRIVER_VERSION, branch: str = "r550_00") -> bytes:
    """The PCI configuration space of a vGPU as its guest sees it: the capability list (power
    management, MSI, PCI Express) ending in NVIDIA's vendor-specific capability (ID 09): signature
    "VF" at bytes 3-4, then the host driver record (ID 0: 10 bytes of version, 10 of branch)."""
    return _config(device, vendor_record=b"VF" + bytes([0, 22]) + _padded(host_version) + _padded(branch))


def gpu_config(device: str) -> bytes:
    """A passed-through GPU's configuration space: the same list without the vGPU capability."""
    return _config(device, vendor_record=None)


def _padded(text: str) -> bytes:
    return text.encode()[:10].ljust(10, b"\0")


def _config(device: str, vendor_record: bytes | None) -> bytes:
    space = bytearray(256)
    space[0:4] = bytes.fromhex("de10") + int(device, 16).to_bytes(2, "little")
    space[6] = 0x10  # status: a capability list follows
    space[8:12] = bytes([0xA1, 0x00, 0x02, 0x03])  # revision, then class 0302 (3D controller)
    space[0x2C:0x30] = bytes.fromhex("de10") + int(device, 16).to_bytes(2, "little")  # subsystem
    space[0x34] = 0x60
    space[0x60:0x62] = bytes([0x01, 0x68])  # power management -> MSI
    space[0x68:0x6A] = bytes([0x05, 0x78])  # MSI -> PCI Express
    space[0x78:0x7A] = bytes([0x10, 0xC8 if vendor_record else 0x00])
    if vendor_record:
        cap = bytes([0x09, 0x00, 3 + len(vendor_record)]) + vendor_record
        space[0xC8 : 0xC8 + len(cap)] = cap
    return bytes(space)


def guest_spec(
    gpus: int = 1,
    model: str = "h100-sxm5",
    *,
    vgpu: bool = False,
    nvswitches: int = 0,
    driver: bool = False,
    nvlink_disabled: bool = False,
) -> dict[str, Any]:
    """A KubeVirt guest's host tree with `gpus` GPUs of `model` given to it (passed through, or
    vGPUs with `vgpu`), `nvswitches` NVSwitches given too, and, with `driver`, the nvidia module
    loaded (as the operator's driver container leaves it; `nvlink_disabled`: loaded with
    NVreg_NvLinkDisable=1)."""
    if model not in MODELS:
        raise ValueError(f"model {model!r}: choose one of {', '.join(MODELS)}")
    if gpus < 1:
        raise ValueError("gpus: give at least 1")
    device = MODELS[model][0]
    devices: list[dict[str, Any]] = [
        {
            "address": address,
            "vendor": vendor,
            "device": dev,
            "class": cls,
            "parent": "pci0000:00",
            "numa_node": -1,
            **({"driver": drv} if drv else {}),
        }
        for address, vendor, dev, cls, drv in _CHIPSET
    ]
    port = 0
    for vendor, dev, cls, drv in _VIRTIO:
        port += 1
        devices.append(_behind_port(port, vendor, dev, cls, drv))
    config = (vgpu_config if vgpu else gpu_config)(device).hex()
    for _ in range(gpus):
        port += 1
        gpu = _behind_port(port, "10de", device, "030200", "nvidia" if driver else None)
        devices.append({**gpu, "config": config})
    for _ in range(nvswitches):
        port += 1
        devices.append(_behind_port(port, "10de", NVSWITCH_DEVICE, "068000", None))
    port += 1
    devices.append(_behind_port(port, "1af4", "1045", "00ff00", "virtio-pci"))  # memory balloon
    dmi = "/sys/devices/virtual/dmi/id"
    files: dict[str, str] = {f"{dmi}/{key}": f"{value}\n" for key, value in KUBEVIRT_DMI.items()}
    files["/proc/cpuinfo"] = "".join(
        f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel Xeon Processor (Sapphire Rapids)\n"
        f"flags\t\t: {_FLAGS}\n\n"
        for cpu in range(2)
    )
    files.update(_CONTAINERD)
    spec: dict[str, Any] = {
        "description": f"KubeVirt VM guest with {gpus} {model}" + (" vGPU(s)" if vgpu else " passed through"),
        "os": {"id": "ubuntu", "version_id": "22.04", "pretty": "Ubuntu 22.04.5 LTS"},
        "kernel": "5.15.0-119-generic",
        "cmdline": "BOOT_IMAGE=/vmlinuz-5.15.0-119-generic root=/dev/vda1 ro console=ttyS0",
        "iommu": False,
        "root_port": dict(ROOT_PORT),
        "devices": devices,
        "modules": ["virtio_net", "virtio_blk"],
        "pci_drivers": [],
        "files": files,
        "symlinks": {"/sys/class/dmi/id": "../../devices/virtual/dmi/id"},
    }
    if driver:
        spec["modules"] += ["nvidia", "nvidia_uvm", "nvidia_modeset"]
        spec["driver_version"] = HOST_DRIVER_VERSION
        files["/proc/driver/nvidia/params"] = _PARAMS.format(nvlink=1 if nvlink_disabled else 0)
        # the driver container's root, where the operator's driver puts its user space
        spec["executables"] = {"/run/nvidia/driver/usr/bin/nvidia-smi": _NVIDIA_SMI}
    return spec


def _behind_port(port: int, vendor: str, device: str, cls: str, driver: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "address": f"0000:{port:02x}:00.0",
        "vendor": vendor,
        "device": device,
        "class": cls,
        "parent": f"pci0000:00/{root_port(port)}",
        "numa_node": -1,
    }
    if driver:
        entry["driver"] = driver
    return entry
