"""`vfio-manage persist`: make the vfio-pci binding survive a reboot (an early-boot driver_override script
plus the vfio module lines in the initramfs), undo exactly that, and tell what the host's boot config
persists today (the probe and doctor read `persisted`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from gpu_operator.node.host import pci
from gpu_operator.node.host.driver import os_release
from gpu_operator.node.host.hostfs import HostFS

MARKER = "written by gpu-operator vfio-manage persist"
BLOCK_BEGIN = f"# >>> {MARKER}"
BLOCK_END = "# <<< gpu-operator vfio-manage persist"
CREATED_NOTE = "# (this file did not exist before; --remove deletes it when nothing else is left)"
VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
# A one-boot escape hatch: this word on the kernel command line makes our early script do nothing.
SKIP_PARAM = "gpu_operator.vfio=off"

INITRAMFS_TOOLS_SCRIPT = "/etc/initramfs-tools/scripts/init-top/gpu-operator-vfio-pci"
INITRAMFS_TOOLS_MODULES = "/etc/initramfs-tools/modules"
DRACUT_MODULE_DIR = "/usr/lib/dracut/modules.d/90gpu-operator-vfio"
DRACUT_HOOK = f"{DRACUT_MODULE_DIR}/gpu-operator-vfio-pci.sh"
DRACUT_SETUP = f"{DRACUT_MODULE_DIR}/module-setup.sh"
DRACUT_CONF = "/etc/dracut.conf.d/90-gpu-operator-vfio.conf"
EARLY_SCRIPT_DIRS = (
    "/etc/initramfs-tools/scripts/init-top",
    "/etc/initramfs-tools/scripts/init-premount",
    "/usr/lib/dracut/modules.d",
)
_DEBIAN = {"debian", "ubuntu", "linuxmint", "pop"}
_RHEL = {"rhel", "fedora", "centos", "rocky", "almalinux", "ol", "amzn", "suse", "sles", "opensuse"}
_ADDRESS_IN_TEXT = re.compile(r"\b[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]\b")
_VFIO_IDS = re.compile(r"vfio[-_]pci\.ids=(\S+)")

Flavor = Literal["initramfs-tools", "dracut"]


class PersistError(ValueError):
    """persist cannot do its job on this host; the message says why and what to do instead."""


class PersistInfo(BaseModel):
    """What the host's boot configuration does with GPUs and the vfio modules at the next boot."""

    flavor: str = Field(default="", description="initramfs-tools, dracut, or empty when neither was found")
    persisted: dict[str, str] = Field(
        default_factory=dict, description="PCI address -> what puts it on vfio-pci at boot"
    )
    ours: list[str] = Field(default_factory=list, description="addresses listed in our own early script")
    boot_modules: list[str] = Field(default_factory=list, description="vfio modules the initramfs loads")


@dataclass
class PersistResult:
    flavor: Flavor
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed)


def flavor_of(fs: HostFS) -> Flavor:
    """Which initramfs generator the host uses: from os-release ID/ID_LIKE, else from what is installed."""
    release = os_release(fs)
    ids = {release.get("ID", "").lower(), *release.get("ID_LIKE", "").lower().split()}
    if ids & _DEBIAN:
        return "initramfs-tools"
    if ids & _RHEL:
        return "dracut"
    if fs.is_dir("/etc/initramfs-tools"):
        return "initramfs-tools"
    if fs.is_dir("/usr/lib/dracut") or fs.is_dir("/etc/dracut.conf.d"):
        return "dracut"
    raise PersistError(
        f"the host root's os-release says ID={release.get('ID', '?')!r} ID_LIKE={release.get('ID_LIKE', '')!r} "
        "and it has neither /etc/initramfs-tools nor dracut: vfio-manage persist writes initramfs-tools or "
        "dracut configuration only. Fix: on an image-based OS (e.g. Talos) bind at boot through its machine "
        "configuration (kernel args vfio-pci.ids=10de:<device>), or bind after boot with the vfio-manager"
    )


def regenerate_command(flavor: str) -> str:
    """The command that rebuilds the initramfs for a generator ("" when unknown)."""
    return {"initramfs-tools": "update-initramfs -u -k all", "dracut": "dracut -f --regenerate-all"}.get(
        flavor, ""
    )


def rollback_text(flavor: Flavor) -> list[str]:
    files = (
        f"rm {INITRAMFS_TOOLS_SCRIPT}"
        if flavor == "initramfs-tools"
        else f"rm -r {DRACUT_MODULE_DIR} {DRACUT_CONF}"
    )
    return [
        f"one boot without it: add {SKIP_PARAM} to the kernel command line in the boot loader (GRUB: press e)",
        f"for good, from a recovery console: {files}; {regenerate_command(flavor)}; reboot "
        "(or run `gpu-operator vfio-manage persist --remove --host-root=/` and regenerate)",
    ]


def _override_loop(addresses: list[str]) -> str:
    return (
        f'grep -qw "{SKIP_PARAM}" /proc/cmdline && exit 0\n'
        f"for dev in {' '.join(addresses)}; do\n"
        '  f="/sys/bus/pci/devices/$dev/driver_override"\n'
        '  [ -w "$f" ] && echo vfio-pci > "$f"\n'
        "done\n"
    )


def initramfs_tools_script(addresses: list[str]) -> str:
    return (
        "#!/bin/sh\n"
        f"# {MARKER}.\n"
        "# Gives these PCI functions to vfio-pci before any GPU driver can claim them (init-top runs\n"
        "# before udev loads modules; udev rules or driverctl run too late and can hang the unbind).\n"
        f"# Skip it for one boot with {SKIP_PARAM} on the kernel command line.\n"
        'PREREQ=""\n'
        'prereqs() { echo "$PREREQ"; }\n'
        'case "$1" in prereqs) prereqs; exit 0 ;; esac\n'
        + _override_loop(addresses)
        + "modprobe -q vfio-pci || true\n"
        "exit 0\n"
    )


def dracut_hook(addresses: list[str]) -> str:
    return (
        "#!/bin/sh\n"
        f"# {MARKER}: vfio-pci driver_override for these PCI functions, before udev loads GPU drivers.\n"
        + _override_loop(addresses).replace("exit 0", "return 0")
        + "modprobe -q vfio-pci || true\n"
    )


def dracut_setup() -> str:
    return (
        "#!/bin/bash\n"
        f"# {MARKER}: dracut module that runs gpu-operator-vfio-pci.sh as a pre-udev hook.\n"
        "check() { return 0; }\n"
        "depends() { return 0; }\n"
        "installkernel() { instmods " + " ".join(VFIO_MODULES) + "; }\n"
        'install() { inst_hook pre-udev 00 "$moddir/gpu-operator-vfio-pci.sh"; }\n'
    )


def dracut_conf() -> str:
    return (
        f'# {MARKER}\nadd_dracutmodules+=" gpu-operator-vfio "\nforce_drivers+=" {" ".join(VFIO_MODULES)} "\n'
    )


def _module_block(created: bool) -> str:
    lines = [BLOCK_BEGIN, *([CREATED_NOTE] if created else []), *VFIO_MODULES, BLOCK_END]
    return "\n".join(lines) + "\n"


def _strip_block(text: str) -> tuple[str, bool, bool]:
    """(text without our block, whether a block was found, whether the block says it created the file)."""
    out, inside, found, created = [], False, False, False
    for line in text.splitlines(keepends=True):
        if line.strip() == BLOCK_BEGIN:
            inside, found = True, True
            continue
        if inside:
            created |= line.strip() == CREATED_NOTE
            if line.strip() == BLOCK_END:
                inside = False
            continue
        out.append(line)
    return "".join(out), found, created


def _is_ours(fs: HostFS, path: str) -> bool:
    return MARKER in (fs.read_text(path) or "")


def _put(fs: HostFS, path: str, text: str, mode: int, result: PersistResult) -> None:
    if fs.read_text(path) == text:
        result.unchanged.append(path)
        return
    if fs.exists(path) and not _is_ours(fs, path):
        raise PersistError(
            f"{path} exists and was not written by vfio-manage persist; refusing to overwrite it. "
            "Fix: move it aside (it may be an older hand-written setup), then run persist again"
        )
    fs.write_atomic(path, text)
    fs.resolve(path).chmod(mode)
    result.written.append(path)


def _drop(fs: HostFS, path: str, result: PersistResult) -> None:
    if fs.exists(path) and _is_ours(fs, path):
        fs.remove(path)
        result.removed.append(path)


def _write_modules(fs: HostFS, result: PersistResult) -> None:
    current = fs.read_text(INITRAMFS_TOOLS_MODULES)
    rest, found, created = _strip_block(current or "")
    wanted = (
        rest + ("" if not rest or rest.endswith("\n") else "\n") + _module_block(created or current is None)
    )
    if found and current == wanted:
        result.unchanged.append(INITRAMFS_TOOLS_MODULES)
        return
    fs.write_atomic(INITRAMFS_TOOLS_MODULES, wanted)
    result.written.append(INITRAMFS_TOOLS_MODULES)


def _remove_modules(fs: HostFS, result: PersistResult) -> None:
    current = fs.read_text(INITRAMFS_TOOLS_MODULES)
    if current is None:
        return
    rest, found, created = _strip_block(current)
    if not found:
        return
    if created and not rest.strip():
        fs.remove(INITRAMFS_TOOLS_MODULES)
    else:
        fs.write_atomic(INITRAMFS_TOOLS_MODULES, rest)
    result.removed.append(INITRAMFS_TOOLS_MODULES)


def persist(fs: HostFS, addresses: list[str]) -> PersistResult:
    """Write (or rewrite) our boot configuration for `addresses`; a second run with the same list writes nothing."""
    if not addresses:
        raise PersistError("no PCI function to persist: name the GPUs with --all or --device")
    flavor = flavor_of(fs)
    result = PersistResult(flavor)
    wanted = sorted(set(addresses))
    if flavor == "initramfs-tools":
        _put(fs, INITRAMFS_TOOLS_SCRIPT, initramfs_tools_script(wanted), 0o755, result)
        _write_modules(fs, result)
    else:
        _put(fs, DRACUT_HOOK, dracut_hook(wanted), 0o755, result)
        _put(fs, DRACUT_SETUP, dracut_setup(), 0o755, result)
        _put(fs, DRACUT_CONF, dracut_conf(), 0o644, result)
    others = {
        a: how for a, how in inspect(fs).persisted.items() if a in wanted and "vfio-manage persist" not in how
    }
    for address, how in sorted(others.items()):
        result.notes.append(f"{address} is also put on vfio-pci by {how} (not ours; left alone)")
    return result


def remove(fs: HostFS) -> PersistResult:
    """Remove exactly what persist wrote (files carrying our marker, our block in the modules file)."""
    flavor = flavor_of(fs)
    result = PersistResult(flavor)
    if flavor == "initramfs-tools":
        _drop(fs, INITRAMFS_TOOLS_SCRIPT, result)
        _remove_modules(fs, result)
    else:
        for path in (DRACUT_HOOK, DRACUT_SETUP, DRACUT_CONF):
            _drop(fs, path, result)
        if fs.is_dir(DRACUT_MODULE_DIR) and not fs.listdir(DRACUT_MODULE_DIR):
            fs.resolve(DRACUT_MODULE_DIR).rmdir()
    return result


def _early_scripts(fs: HostFS) -> list[str]:
    out = []
    for directory in EARLY_SCRIPT_DIRS:
        for name in fs.listdir(directory):
            path = f"{directory}/{name}"
            if fs.is_dir(path):  # a dracut module directory
                out += [f"{path}/{inner}" for inner in fs.listdir(path)]
            else:
                out.append(path)
    return out


def _boot_modules(fs: HostFS) -> list[str]:
    found: set[str] = set()
    files = [INITRAMFS_TOOLS_MODULES] + [f"/etc/dracut.conf.d/{n}" for n in fs.listdir("/etc/dracut.conf.d")]
    for path in files:
        for line in (fs.read_text(path) or "").splitlines():
            words = line.split("#", 1)[0].replace('"', " ").replace("+=", " ").replace("=", " ").split()
            found |= {w.replace("-", "_") for w in words if w.replace("-", "_") in VFIO_MODULES}
    return [m for m in VFIO_MODULES if m in found]


def inspect(fs: HostFS, functions: list[pci.PciFunction] | None = None) -> PersistInfo:
    """Which PCI functions the boot configuration puts on vfio-pci, and which vfio modules the initramfs loads."""
    try:
        flavor: str = flavor_of(fs)
    except PersistError:
        flavor = ""
    functions = functions if functions is not None else pci.scan(fs, pci.NVIDIA_VENDOR)
    persisted: dict[str, str] = {}
    ours: list[str] = []
    for path in _early_scripts(fs):
        text = fs.read_text(path) or ""
        if "driver_override" not in text or "vfio" not in text:
            continue
        listed = _ADDRESS_IN_TEXT.findall(text.lower())
        how = f"{path}" + (" (vfio-manage persist)" if MARKER in text else "")
        for address in listed:
            persisted.setdefault(address, how)
        if MARKER in text:
            ours += listed
    ids: set[str] = set()
    for match in _VFIO_IDS.findall(fs.read_value("/proc/cmdline") or ""):
        ids |= {i.lower() for i in match.split(",")}
    for name in fs.listdir("/etc/modprobe.d"):
        for line in (fs.read_text(f"/etc/modprobe.d/{name}") or "").splitlines():
            words = line.split()
            if words[:2] in (["options", "vfio-pci"], ["options", "vfio_pci"]):
                for word in words[2:]:
                    if word.startswith("ids="):
                        ids |= {i.lower() for i in word[4:].split(",")}
    for func in functions:
        if func.vendor_device in ids:
            persisted.setdefault(func.address, f"vfio-pci ids={func.vendor_device}")
    return PersistInfo(
        flavor=flavor, persisted=persisted, ours=sorted(set(ours)), boot_modules=_boot_modules(fs)
    )
