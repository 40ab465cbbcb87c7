"""Where a host's NVIDIA driver comes from: distribution packages, an OS extension tree, the operator, or nowhere."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, Field

from gpu_operator.node.host.hostfs import HostFS

OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
# A driver installed as one directory holding bin/ and lib64/: GKE's driver installer puts it in
# /home/kubernetes/bin/nvidia on the host and mounts that at /usr/local/nvidia in containers
# (GoogleCloudPlatform/container-engine-accelerators, nvidia-driver-installer: NVIDIA_INSTALL_DIR_HOST,
# NVIDIA_INSTALL_DIR_CONTAINER); VMs and containers given a GPU with the driver mounted read-only at
# /usr/local/nvidia look the same. NVIDIA's lookups find nvidia-smi and the libraries in such a root
# (its /bin and /lib64 are in ROOT_BIN_DIRS and ROOT_LIB_DIRS), but the host's loader does not.
BUNDLE_ROOTS = ("/home/kubernetes/bin/nvidia", "/usr/local/nvidia")
# Upstream's validator list, plus /usr/local/bin where Talos' extension puts nvidia-smi and the
# glibc tree of OS-extension drivers: hard-coding /usr/bin is a known pain.
SMI_SEARCH_DIRS = (
    "/usr/bin",
    "/usr/sbin",
    "/bin",
    "/sbin",
    "/usr/lib/wsl/lib",
    "/opt/bin",
    "/usr/local/bin",
    "/usr/local/glibc/usr/bin",
    "/usr/local/glibc/bin",
    *(f"{root}/bin" for root in BUNDLE_ROOTS),
)
NVML_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/glibc/usr/lib",
    "/usr/local/glibc/lib",
    "/usr/lib/wsl/lib",
    *(f"{root}/lib64" for root in BUNDLE_ROOTS),
)
# Where NVIDIA's components look inside a driver root (the host path they get as
# NVIDIA_DRIVER_ROOT): nvidia-smi in the validator's and the DRA kubelet plugin's binary dirs
# (gpu-operator internal/driver/root.go, k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/root.go), the
# libraries in the toolkit's library dirs (nvidia-container-toolkit pkg/lookup/library.go), plus the
# glibc tree of Talos' extension, which that tree's ld cache points the toolkit at (ours: not in
# NVIDIA's lists).
ROOT_BIN_DIRS = ("/", "/opt/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
ROOT_LIB_DIRS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/glibc/usr/lib",
    "/glibc/lib",
)
# A host driver's root: the host's own root, else the tree an OS extension installs it in (Talos:
# nvidia-smi in /usr/local/bin, the libraries under /usr/local/glibc), the first that holds it.
HOST_DRIVER_ROOTS = ("/", "/usr/local", *BUNDLE_ROOTS)
_KERNEL_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


class DriverSource(StrEnum):
    HOST = "host"
    OPERATOR = "operator"
    VFIO = "vfio"
    NONE = "none"


class DriverInfo(BaseModel):
    """The driver found on a host and the evidence for it."""

    source: DriverSource
    flavor: str = Field(default="", description="distribution, talos, wsl, operator or ''")
    driver_root: str | None = Field(
        default=None, description="host path every component takes as NVIDIA_DRIVER_ROOT (driver-ready)"
    )
    nvidia_smi: str | None = Field(default=None, description="host path of nvidia-smi")
    run_root: str = Field(default="/", description="host directory to chroot into to run nvidia-smi")
    smi_in_root: str | None = Field(default=None, description="nvidia-smi's path inside run_root")
    smi_env: dict[str, str] = Field(
        default_factory=dict,
        description="environment nvidia-smi needs (a bundle root's lib64 for its loader)",
    )
    kernel_module_loaded: bool = False
    kernel_version: str | None = None
    nvml_library: str | None = None
    operator_root_present: bool = False
    host_userspace: bool = False
    evidence: list[str] = Field(default_factory=list)


def module_names(fs: HostFS) -> set[str]:
    """Loaded kernel modules (/proc/modules, plus built-ins visible under /sys/module with a refcnt)."""
    text = fs.read_text("/proc/modules") or ""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def under_root(root: str, path: str) -> str:
    """`path` inside the driver root `root`, as a host path."""
    return root.rstrip("/") + path if path != "/" else root


def find_executable(fs: HostFS, name: str, dirs: tuple[str, ...] | list[str]) -> str | None:
    for directory in dirs:
        path = f"{directory.rstrip('/')}/{name}"
        if fs.is_executable(path):
            return path
    return None


def find_nvml(fs: HostFS, root: str = "/", dirs: tuple[str, ...] = NVML_LIBRARY_DIRS) -> str | None:
    """The first libnvidia-ml in `dirs` under `root` (a host path), None where there is none."""
    for directory in dirs:
        where = under_root(root, directory)
        names = sorted(e for e in fs.listdir(where) if e.startswith("libnvidia-ml.so"))
        if names:
            return f"{where.rstrip('/')}/{names[0]}"
    return None


def driver_files(fs: HostFS, root: str) -> tuple[str | None, str | None]:
    """nvidia-smi and libnvidia-ml as NVIDIA's components find them under the driver root `root`
    (host paths), None where they find none."""
    smi = find_executable(fs, "nvidia-smi", [under_root(root, d) for d in ROOT_BIN_DIRS])
    return smi, find_nvml(fs, root, ROOT_LIB_DIRS)


def host_driver_root(fs: HostFS) -> str:
    """The driver root of a host driver: the first of HOST_DRIVER_ROOTS under which NVIDIA's
    components find nvidia-smi or libnvidia-ml; `/` when none holds either."""
    for root in HOST_DRIVER_ROOTS:
        if any(driver_files(fs, root)):
            return root
    return "/"


def os_release(fs: HostFS) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        text = fs.read_text(path)
        if text is None:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.startswith("#"):
                out[key.strip()] = value.strip().strip('"').strip("'")
        break
    return out


def kernel_driver_version(fs: HostFS) -> str | None:
    match = _KERNEL_VERSION.search(fs.read_text("/proc/driver/nvidia/version") or "")
    return match.group(1) if match else None


def detect_driver(
    fs: HostFS,
    *,
    gpus_all_on_vfio: bool = False,
    extra_search_dirs: tuple[str, ...] = (),
    operator_root: str = OPERATOR_DRIVER_ROOT,
) -> DriverInfo:
    """Decide the driver source from files only (running nvidia-smi is the validator's job)."""
    evidence: list[str] = []
    modules = module_names(fs)
    loaded = "nvidia" in modules or fs.exists("/sys/module/nvidia/refcnt")
    if loaded:
        evidence.append("kernel module nvidia is loaded (/proc/modules)")
    version = kernel_driver_version(fs)
    if version:
        evidence.append(f"/proc/driver/nvidia/version reports kernel module {version}")
    # /proc/driver/nvidia exists only while the module is loaded, even if /proc/modules is unreadable.
    loaded = loaded or version is not None

    smi = find_executable(fs, "nvidia-smi", (*extra_search_dirs, *SMI_SEARCH_DIRS))
    nvml = find_nvml(fs)
    if smi:
        evidence.append(f"nvidia-smi found on the host at {smi}")
    if nvml:
        evidence.append(f"libnvidia-ml found on the host at {nvml}")

    operator_smi = find_executable(fs, "nvidia-smi", [f"{operator_root}{d}" for d in ("/usr/bin", "/bin")])
    if operator_smi:
        evidence.append(f"operator driver root populated ({operator_smi})")

    release = os_release(fs)
    talos = release.get("ID") == "talos" or bool(nvml and nvml.startswith("/usr/local/glibc"))
    wsl = bool(smi and smi.startswith("/usr/lib/wsl"))
    base = DriverInfo(
        source=DriverSource.NONE,
        kernel_module_loaded=loaded,
        kernel_version=version,
        nvml_library=nvml,
        operator_root_present=bool(operator_smi),
        host_userspace=bool(smi or nvml),
        evidence=evidence,
    )
    if smi or nvml:
        flavor = "talos" if talos else "wsl" if wsl else "distribution"
        root = host_driver_root(fs)
        return base.model_copy(
            update={
                "source": DriverSource.HOST,
                "flavor": flavor,
                "driver_root": root,
                "nvidia_smi": smi,
                "smi_in_root": smi,
                "smi_env": {"LD_LIBRARY_PATH": f"{root}/lib64"} if root in BUNDLE_ROOTS else {},
            }
        )
    if operator_smi:
        return base.model_copy(
            update={
                "source": DriverSource.OPERATOR,
                "flavor": "operator",
                "driver_root": operator_root,
                "nvidia_smi": operator_smi,
                "run_root": operator_root,
                "smi_in_root": operator_smi.removeprefix(operator_root),
            }
        )
    if loaded:
        # A loaded module without any user space: still a host driver, but an incomplete one.
        return base.model_copy(
            update={
                "source": DriverSource.HOST,
                "flavor": "talos" if talos else "distribution",
                "driver_root": host_driver_root(fs),
            }
        )
    if gpus_all_on_vfio:
        evidence.append("every NVIDIA GPU is bound to a vfio driver")
        return base.model_copy(update={"source": DriverSource.VFIO})
    return base
