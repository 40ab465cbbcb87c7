"""`gpu-operator node cuda-check`: the CUDA driver-API check (cudacheck.py) as a container's command,
the validator's CUDA workload when NVIDIA's CUDA sample image is not used (CUDA_WORKLOAD=driver-api).

In a GPU container the NVIDIA container toolkit has mounted the driver's libcuda.so.1 into the
container's library directory (/usr/lib/x86_64-linux-gnu in a Debian-based image such as ours,
/usr/lib64 otherwise: NVIDIA/libnvidia-container src/nvc_container.c) and refreshed the loader's
cache, so the loader's search finds it; a driver mounted whole elsewhere (/usr/local/nvidia/lib64)
is found through LD_LIBRARY_PATH or our search of the usual driver roots (tools.find_libcuda).

Every step is printed as it ends. Exit 0: the kernel ran and every value came back right. Exit 1:
anything else, and the last line names what failed (a CUDA error by name and number) and a likely
fix: the pod's termination message, which the validator quotes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.node.gpucheck.cudacheck import ELEMENTS, PTX, CudaResult, load_libcuda, run_cuda_check
from gpu_operator.node.gpucheck.tools import SONAMES, find_libcuda
from gpu_operator.node.host.hostfs import HostFS

EXIT_OK, EXIT_FAILED = 0, 1
SONAME = SONAMES["cuda"]
LOADER = f"{SONAME} (the loader's search)"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
_GPU_NODE = re.compile(r"nvidia[0-9]+")
PTX_ISA = PTX.split()[1]  # ".version 7.0 ..."
_GIVE_GPU = (
    "run the pod with the NVIDIA runtime (its RuntimeClass, or CDI) and NVIDIA_VISIBLE_DEVICES=all or a "
    "nvidia.com/gpu limit, and check the node's toolkit validation (toolkit-ready)"
)
_XID = "look for Xid errors in the host's kernel log (`gpu-operator doctor` lists them) and check the GPU's health"
# What a CUresult most likely means in a container the toolkit prepared, and what to do about it.
FIXES = {
    2: "other processes hold the GPU's memory: see `nvidia-smi` on the host",
    34: "the libcuda loaded is the CUDA toolkit's stub (a .../stubs directory): take it out of "
    "LD_LIBRARY_PATH so that the driver's libcuda.so.1 is used",
    46: "the GPU is in use in an exclusive compute mode or unavailable: `nvidia-smi -q` on the host "
    "shows its Compute Mode (set Default with `nvidia-smi -c DEFAULT`)",
    209: "the driver cannot build our PTX for this GPU: a driver too old for this GPU",
    214: f"the GPU reports an uncorrectable ECC error: {_XID}",
    218: f"the driver could not compile our PTX (ISA {PTX_ISA}, sm_50): a driver older than R450 (CUDA 11.0), "
    "or libnvidia-ptxjitcompiler.so.1 not injected (NVIDIA_DRIVER_CAPABILITIES must include compute)",
    221: "libnvidia-ptxjitcompiler.so.1 is not in the container: NVIDIA_DRIVER_CAPABILITIES must include "
    "compute so that the toolkit injects it",
    222: f"the driver is older than our PTX ISA {PTX_ISA} (CUDA 11.0): upgrade the driver to R450 or newer",
    700: f"the GPU faulted running the kernel: {_XID}",
    719: f"the kernel launch failed on the GPU: {_XID}",
    802: "the system is not ready for CUDA: on NVSwitch systems (HGX/DGX) NVIDIA Fabric Manager must run "
    "and have set up the fabric (start nvidia-fabricmanager); a VM given NVSwitch GPUs without their "
    "NVSwitches needs NVLink disabled (docs/vm-passthrough.md)",
    803: "the libcuda in the container comes from another driver version than the loaded kernel module: "
    "the toolkit injected another driver root's libraries (check its driver root), or the host needs "
    "a reboot after a driver upgrade",
    804: "a CUDA forward-compatibility libcuda (cuda-compat) is used on a GPU that does not support it: "
    "take its directory out of LD_LIBRARY_PATH",
}


@dataclass
class DeviceNodes:
    """The driver's device nodes the container was given (by name; CUDA opens them in cuInit)."""

    control: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, fs: HostFS) -> DeviceNodes:
        return cls(
            [p for p in CONTROL_NODES if fs.exists(p)],
            [f"/dev/{n}" for n in fs.listdir("/dev") if _GPU_NODE.fullmatch(n)],
        )

    def missing(self) -> list[str]:
        return [p for p in CONTROL_NODES if p not in self.control] + ([] if self.gpus else ["/dev/nvidiaN"])

    def summary(self) -> str:
        found = self.control + sorted(self.gpus, key=lambda p: int(p.removeprefix("/dev/nvidia")))
        missing = self.missing()
        return (", ".join(found) or "none") + (f"; missing: {', '.join(missing)}" if missing else "")


@dataclass
class Loaded:
    lib: Any | None
    where: str
    problems: list[str]


def load(fs: HostFS, loader: Callable[[str | None], Any]) -> Loaded:
    """libcuda by its soname through the loader (as a CUDA program loads it), else the first
    libcuda our search finds; each failed attempt with the loader's reason."""
    problems: list[str] = []
    try:
        return Loaded(loader(None), LOADER, problems)
    except OSError as err:
        problems.append(f"the loader's search: {err}")
    found = find_libcuda(fs).path
    if found:
        try:
            return Loaded(loader(found), found, problems)
        except OSError as err:  # the loader's message names the file already
            problems.append(str(err) if str(err).startswith(found) else f"{found}: {err}")
    return Loaded(None, found or "", problems)


def _library_failure(loaded: Loaded, nodes: DeviceNodes) -> str:
    tried = "; ".join(loaded.problems)
    if not loaded.where:
        no_gpu = " and no GPU device node either" if not nodes.gpus else ""
        return (
            f"{SONAME} (the driver's CUDA library) is not in this container{no_gpu} ({tried}). "
            f"Likely fix: the NVIDIA container toolkit did not give this container the driver: {_GIVE_GPU}"
        )
    return (
        f"{SONAME} at {loaded.where} cannot be loaded ({tried}). Likely fix: the driver's library the "
        "toolkit mounted from the host is damaged, empty or for another architecture: check the driver "
        "installation on the host (the driver validation) and the toolkit's driver root"
    )


def _cuda_failure(result: CudaResult, nodes: DeviceNodes, where: str) -> str:
    if not result.failed_call:
        if result.error:  # no CUresult: an entry point missing, or a failed cleanup
            return (
                f"{result.error}. Likely fix: {where} is not a driver's libcuda (a stub or another library) "
                "or a driver older than CUDA 4.0"
            )
        return (
            f"the kernel ran but {result.wrong} of {result.elements_checked} values came back wrong. "
            f"Likely fix: a GPU memory or compute fault: {_XID}"
        )
    code, missing = result.error_code, nodes.missing()
    if code == 100:
        fix = (
            f"the container was given no GPU device node (missing {', '.join(missing)}): {_GIVE_GPU}"
            if not nodes.gpus
            else "the driver sees no usable GPU: check `nvidia-smi` on the host, and that CUDA_VISIBLE_DEVICES "
            f"does not hide it; {_XID}"
        )
    elif code == 999 and missing:
        fix = (
            f"the container lacks {', '.join(missing)}: load the nvidia and nvidia_uvm modules on the host "
            f"(NVIDIA's nvidia-modprobe also creates their device nodes) and {_GIVE_GPU}"
        )
    else:
        fix = FIXES.get(code, f"see {result.error_name} in NVIDIA's CUDA Driver API reference; {_XID}")
    return f"{result.failed_call} returned {result.error_name} ({code}). Likely fix: {fix}"


def run(fs: HostFS, loader: Callable[[str | None], Any], say: Callable[[str], None]) -> int:
    """The check, each step printed through `say`; the exit code."""
    nodes = DeviceNodes.read(fs)
    say(f"device nodes: {nodes.summary()}")
    loaded = load(fs, loader)
    if loaded.lib is None:
        say(f"FAILED: {_library_failure(loaded, nodes)}")
        return EXIT_FAILED
    say(f"libcuda: {loaded.where}" + (f" (after: {'; '.join(loaded.problems)})" if loaded.problems else ""))
    result = run_cuda_check(loaded.lib, say)
    if not result.ok:
        say(f"FAILED: {_cuda_failure(result, nodes, loaded.where)}")
        return EXIT_FAILED
    say(
        f"passed: {result.name} ({result.bus}, compute capability {result.compute_capability}), driver API "
        f"CUDA {result.driver_version}: our PTX kernel ran over {ELEMENTS} values, every one right"
    )
    return EXIT_OK


def cuda_check() -> None:
    """Run the CUDA driver-API check in this container (the driver's libcuda through ctypes: init, a
    context on GPU 0, a kernel from PTX over 1024 values, each checked). Needs no CUDA image. Exit 0:
    passed; 1: failed, the last line naming the CUDA error and a likely fix."""
    import typer

    def say(line: str) -> None:
        print(f"cuda-check: {line}", flush=True)

    try:
        code = run(HostFS("/"), load_libcuda, say)
    except Exception as err:  # noqa: BLE001 - the last line is the pod's message: never a traceback
        say(
            f"FAILED: the check itself failed ({type(err).__name__}: {err}); a defect of gpu-operator: report it"
        )
        code = EXIT_FAILED
    raise typer.Exit(code)
