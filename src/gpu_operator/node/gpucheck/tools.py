"""Where NVIDIA's own tools are on a host: nvidia-smi, libnvidia-ml (NVML) and libcuda, searched in the
usual places of each driver root we know, the first root that holds them named in the report.

The roots: the host's own (a distribution's driver), /usr/local/nvidia (a driver mounted into a
container or VM read-only there, the layout of GKE's and many cloud images: bin/, lib64/ or lib/),
the operator's /run/nvidia/driver, and /usr/local (Talos' extension: bin/ and glibc/). Our agents'
own search (node/host/driver.py) is what is being checked; this search is the reference it is checked
against, so it deliberately looks in more places.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_operator.node.host.driver import OPERATOR_DRIVER_ROOT, ROOT_BIN_DIRS, ROOT_LIB_DIRS, under_root
from gpu_operator.node.host.hostfs import HostFS

CONTAINER_DRIVER_ROOT = "/usr/local/nvidia"
DRIVER_ROOTS = ("/", CONTAINER_DRIVER_ROOT, OPERATOR_DRIVER_ROOT, "/usr/local")
BIN_DIRS = (*ROOT_BIN_DIRS, "/usr/local/bin")
LIB_DIRS = (*ROOT_LIB_DIRS, "/lib", "/usr/lib", "/usr/local/lib", "/usr/lib/wsl/lib")
# the soname each library is asked for by (the loader's name); another file of it is a fallback
SONAMES = {"nvml": "libnvidia-ml.so.1", "cuda": "libcuda.so.1"}
ON_PATH = "PATH"  # the "root" of a nvidia-smi found only through $PATH


@dataclass
class Found:
    """One tool: its host path and the driver root it was found under (None: not found)."""

    path: str | None = None
    root: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"path": self.path, "root": self.root}


@dataclass
class NvidiaTools:
    smi: Found = field(default_factory=Found)
    nvml: Found = field(default_factory=Found)
    cuda: Found = field(default_factory=Found)
    searched: list[str] = field(default_factory=list)

    @property
    def driver_root(self) -> str | None:
        """The root nvidia-smi was found under, else the one of the libraries (a nvidia-smi found only
        on PATH names no root)."""
        return next((f.root for f in (self.smi, self.nvml, self.cuda) if f.root and f.root != ON_PATH), None)

    def as_dict(self) -> dict[str, object]:
        return {
            "driver_root": self.driver_root,
            "nvidia_smi": self.smi.as_dict(),
            "libnvidia_ml": self.nvml.as_dict(),
            "libcuda": self.cuda.as_dict(),
            "searched_roots": self.searched,
        }


def _library(fs: HostFS, root: str, stem: str, soname: str) -> str | None:
    for directory in LIB_DIRS:
        where = under_root(root, directory).rstrip("/") or "/"
        names = [n for n in fs.listdir(where) if n.startswith(f"{stem}.so")]
        if names:
            best = soname if soname in names else sorted(names)[0]
            return f"{where.rstrip('/')}/{best}"
    return None


def find_libcuda(fs: HostFS, roots: tuple[str, ...] = DRIVER_ROOTS) -> Found:
    """libcuda under the first of `roots` that holds it (also what a container's check searches
    where the loader does not find it: node/gpucheck/incontainer.py)."""
    for root in roots:
        if lib := _library(fs, root, "libcuda", SONAMES["cuda"]):
            return Found(lib, root)
    return Found()


def find_tools(fs: HostFS, roots: tuple[str, ...] = DRIVER_ROOTS) -> NvidiaTools:
    """nvidia-smi, libnvidia-ml and libcuda under the first of `roots` that holds each."""
    tools = NvidiaTools(searched=list(roots))
    for root in roots:
        if tools.smi.path is None:
            for directory in BIN_DIRS:
                path = f"{under_root(root, directory).rstrip('/')}/nvidia-smi"
                if fs.is_executable(path):
                    tools.smi = Found(path, root)
                    break
        if tools.nvml.path is None and (lib := _library(fs, root, "libnvidia-ml", SONAMES["nvml"])):
            tools.nvml = Found(lib, root)
    tools.cuda = find_libcuda(fs, roots)
    return tools
