"""What NVIDIA's container toolkit gives a container of the `nvidia` runtime, as rules over a host
tree: the real node's `nvidia` runtime handler (`nvruntime`) applies them, and nothing else.

The rules, from NVIDIA's sources (facts only; see docs/simulator.md):
- nvidia-container-toolkit internal/config/image (cuda_image.go, devices.go, capabilities.go) and
  cmd/nvidia-container-runtime-hook/container_config.go: which devices and capabilities a
  container asks for;
- libnvidia-container src/nvc_info.c and src/nvc_mount.c: what each capability mounts, and which
  driver devices go with which capability.

Requests, first match wins:
1. annotations under `cdi.k8s.io/` (comma-separated fully qualified CDI names; the device plugin's
   CDI-annotations strategy sets them) -> CDI (see `cdi`);
2. NVIDIA_VISIBLE_DEVICES (comma-separated). Unset in a legacy CUDA image (CUDA_VERSION set,
   NVIDIA_REQUIRE_CUDA unset) means `all`. Unset, empty, or any `void`: the container is left
   exactly as it is. `none`: the driver without any GPU. `all`: every GPU. Otherwise GPU indices
   (NVML order, i.e. by PCI address) or UUIDs; a list of only fully qualified CDI names goes to CDI.
   Environment requests count for unprivileged containers too (the toolkit's default).
Capabilities: NVIDIA_DRIVER_CAPABILITIES, `utility,compute` when unset or empty, every supported
one when unset in a legacy image or `all`; an unknown one fails the container.
What is mounted: each capability's binaries and libraries found in the tree; /dev/nvidiactl
always, /dev/nvidia-uvm and -uvm-tools only with `compute`, /dev/nvidia-modeset only with
`display`; each requested GPU's /dev/nvidiaN. Devices are bound from the tree and allowed in the
container's device cgroup, as nvidia-container-cli does.
MIG devices (by MIG UUID or `<GPU>:<MIG>` index, as the device plugin hands them out; the tree's
MIG state, `migtree`): the parent GPU's /dev/nvidiaN and the GPU and compute instances' access cap
nodes /dev/nvidia-caps/nvidia-cap<minor> (libnvidia-container src/nvc_mount.c
`nvc_mig_device_access_caps_mount`, where the `nvidia-caps` major exists). Not played: its mounts
of the access files under /proc (runc refuses OCI mounts there; libnvidia-container makes them
from its hook), the global MIG caps (NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator.node.host.holders import driver_gpus
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.sim.hardware import devnodes
from gpu_operator.sim.realnode import cdi
from gpu_operator.sim.realnode.edits import Edits, InjectionError

CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
DEFAULT_CAPABILITIES = ("utility", "compute")
SUPPORTED = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
BINARIES = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
LIBRARIES = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": (
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-opencl.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-allocator.so",
        "libnvidia-nvvm.so",
        "libnvidia-gpucomp.so",
    ),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libGLX_nvidia.so",
        "libEGL_nvidia.so",
        "libGLESv2_nvidia.so",
    ),
    "ngx": ("libnvidia-ngx.so",),
}
# Where the hook looks for binaries (its PATH) and the host's libraries (its ldcache's dirs).
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib")
CONTAINER_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
_CDI_NAME = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+=[A-Za-z0-9_.:-]+$")


@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int
    uuid: str
    address: str


def gpus(host_root: Path) -> list[Gpu]:
    """The tree's GPUs as NVML numbers them (by PCI address), from the driver's procfs files."""
    found = sorted(driver_gpus(HostFS(host_root)).items())
    return [
        Gpu(i, int(fields["Device Minor"]), fields.get("GPU UUID", ""), address)
        for i, (address, fields) in enumerate(found)
    ]


def _env(config: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (config.get("process") or {}).get("env") or []:
        key, _, value = str(item).partition("=")
        out[key] = value  # a later value wins, as in the process
    return out


def is_legacy(env: dict[str, str]) -> bool:
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def requested(config: dict[str, Any]) -> tuple[str, list[str]]:
    """("cdi", names) for CDI requests, ("env", devices) for the environment's, ("env", []) for none."""
    annotations = config.get("annotations") or {}
    names = [
        name.strip()
        for key in sorted(annotations)
        if key.startswith(CDI_ANNOTATION_PREFIX)
        for name in str(annotations[key]).split(",")
        if name.strip()
    ]
    if names:
        return "cdi", names
    env = _env(config)
    if VISIBLE not in env:
        return "env", ["all"] if is_legacy(env) else []
    devices = [d.strip() for d in env[VISIBLE].split(",") if d.strip()]
    if not devices or "void" in devices:
        return "env", []
    if all(_CDI_NAME.match(d) for d in devices):
        return "cdi", devices
    return "env", devices


def capabilities(config: dict[str, Any]) -> set[str]:
    env = _env(config)
    if CAPABILITIES not in env and is_legacy(env):
        return set(SUPPORTED)
    raw = {c.strip() for c in env.get(CAPABILITIES, "").split(",") if c.strip()}
    if not raw:
        return set(DEFAULT_CAPABILITIES)
    if "all" in raw:
        return set(SUPPORTED)
    unknown = sorted(raw - set(SUPPORTED))
    if unknown:
        raise InjectionError(
            f"{CAPABILITIES}: unsupported capabilities {','.join(unknown)} "
            f"(allowed: {','.join(SUPPORTED)} or all)"
        )
    return raw


def select_gpus(host_root: Path, devices: list[str], caps: list[str] | None = None) -> list[Gpu]:
    """The GPUs a device list names (`all`, `none`, indices, UUIDs, MIG devices: their parent GPU,
    with the MIG device's cap nodes added to `caps`); unknown names fail, as the hook does."""
    from gpu_operator.sim.hardware import migtree

    found = gpus(host_root)
    if "all" in devices:
        return found
    if "none" in devices:
        return []
    chosen: list[Gpu] = []
    for name in devices:
        match = [g for g in found if (name.isdigit() and g.index == int(name)) or g.uuid == name]
        mig = None if match else migtree.mig_device(host_root, name)
        if mig is not None:
            match = [g for g in found if g.index == mig[0].index]
            if match and caps is not None:
                caps.extend(
                    path for path, _ in migtree.access_nodes(match[0].minor, mig[1]) if path not in caps
                )
        if not match:
            have = ", ".join(f"{g.index} ({g.uuid})" for g in found) or "none"
            raise InjectionError(f"{VISIBLE}: unknown device {name!r} (this node has: {have})")
        chosen.extend(g for g in match if g not in chosen)
    return chosen


def _driver_version(host_root: Path) -> str:
    version = host_root / "proc/driver/nvidia/version"
    if not version.is_file():
        return ""
    found = re.search(r"Kernel Module\s+(\S+)", version.read_text())
    return found.group(1) if found else ""


def _binaries(host_root: Path, caps: set[str]) -> list[tuple[Path, str]]:
    out = []
    for cap in sorted(caps & set(BINARIES)):
        for name in BINARIES[cap]:
            for directory in BIN_DIRS:
                source = host_root / directory.lstrip("/") / name
                if source.is_file():
                    out.append((source, f"{directory}/{name}"))
                    break
    return out


def _libraries(host_root: Path, caps: set[str], version: str) -> list[tuple[Path, str]]:
    """Each capability's driver libraries of the driver's version (`<lib>.<version>`), mounted in
    the container's library directory under that name and under its soname (`<lib>.1`)."""
    out = []
    for cap in sorted(caps & set(LIBRARIES)):
        for name in LIBRARIES[cap]:
            for directory in LIB_DIRS:
                source = host_root / directory.lstrip("/") / f"{name}.{version}"
                if version and source.is_file():
                    out.append((source, f"{CONTAINER_LIB_DIR}/{name}.{version}"))
                    out.append((source, f"{CONTAINER_LIB_DIR}/{name}.1"))
                    break
    return out


def _device(host_root: Path, path: str) -> tuple[Path, str, int, int] | None:
    node = host_root / path.lstrip("/")
    found = devnodes.char_device(node)
    return (node, path, *found) if found else None


def legacy_edits(host_root: Path, devices: list[str], caps: set[str]) -> Edits:
    """nvidia-container-cli's work for a container asking for `devices` with `caps`."""
    edits = Edits(mode="legacy")
    version = _driver_version(host_root)
    if not version:
        raise InjectionError(
            "nvidia-container-cli: initialization error: no NVIDIA driver is loaded on this host "
            "(the host has no /proc/driver/nvidia/version)"
        )
    mig_caps: list[str] = []
    chosen = select_gpus(host_root, devices, mig_caps)
    edits.mounts = _binaries(host_root, caps) + _libraries(host_root, caps, version)
    driver_devices = ["/dev/nvidiactl"]
    if "compute" in caps:
        driver_devices += ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    if "display" in caps:
        driver_devices.append("/dev/nvidia-modeset")
    for path in driver_devices + [f"/dev/nvidia{g.minor}" for g in chosen]:
        found = _device(host_root, path)
        if found:
            edits.devices.append(found)
        elif path.startswith("/dev/nvidia") and path[len("/dev/nvidia") :].isdigit():
            raise InjectionError(f"{path}: the device node of a requested GPU is missing from the host")
    for path in mig_caps:  # present where the host has the nvidia-caps major (mighw makes both)
        found = _device(host_root, path)
        if found:
            edits.devices.append(found)
    return edits


def edits_for(config: dict[str, Any], host_root: Path) -> Edits:
    """Everything the `nvidia` runtime adds to one container's OCI config."""
    kind, names = requested(config)
    if kind == "cdi":
        return cdi.edits(host_root, names)
    if not names:
        return Edits()
    return legacy_edits(host_root, names, capabilities(config))
