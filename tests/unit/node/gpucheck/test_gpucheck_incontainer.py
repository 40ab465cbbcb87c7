"""`gpu-operator node cuda-check`, the driver-API check as a container's command: against the stand-in
libcuda (tests/unit/node/gpucheck_fakes.py) in a container root built in a temporary directory (its
/dev and library directories), each failing step ends with one last line naming the error by name
and number and a likely fix, and never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.node.gpucheck.incontainer import EXIT_FAILED, EXIT_OK, LOADER, run
from gpu_operator.node.host.hostfs import HostFS
from tests.unit.node.gpucheck_fakes import FakeLibCuda

ALL_NODES = ("dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia0", "dev/nvidia1")
LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
NOT_FOUND = "libcuda.so.1: cannot open shared object file: No such file or directory"


def container(root: Path, nodes: tuple[str, ...] = ALL_NODES, lib: str | None = LIB) -> HostFS:
    for node in nodes:
        (root / node).parent.mkdir(parents=True, exist_ok=True)
        (root / node).write_text("")
    if lib:
        (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / lib.lstrip("/")).write_text("")
    return HostFS(root)


class Loader:
    """ctypes.CDLL as the command calls it: None asks the loader for the soname, a path loads that file."""

    def __init__(self, by_name: Any = None, by_path: dict[str, Any] | None = None) -> None:
        self.by_name, self.by_path = by_name, by_path or {}
        self.asked: list[str | None] = []

    def __call__(self, path: str | None) -> Any:
        self.asked.append(path)
        found = self.by_name if path is None else self.by_path.get(path)
        if isinstance(found, OSError) or found is None:
            raise found or OSError(f"{path}: cannot open shared object file: No such file or directory")
        return found


def check(fs: HostFS, loader: Loader) -> tuple[int, list[str]]:
    lines: list[str] = []
    return run(fs, loader, lines.append), lines


def test_success_prints_every_call_and_passes(tmp_path: Path) -> None:
    lib = FakeLibCuda()
    code, lines = check(container(tmp_path), Loader(by_name=lib))
    assert code == EXIT_OK
    assert lines[0] == "device nodes: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia0, /dev/nvidia1"
    assert lines[1] == f"libcuda: {LOADER}"
    # one line per driver call, in the order made, each with its CUresult's name
    calls = [line.split(":")[0] for line in lines if line.endswith(": CUDA_SUCCESS")]
    assert calls == lib.calls
    assert "device 0: NVIDIA H100 80GB HBM3, PCI 0000:00:06.0, compute capability 9.0" in lines
    assert "kernel scale_add over 1024 values: 1024 right, 0 wrong" in lines
    assert lines[-1].startswith("passed: NVIDIA H100 80GB HBM3 (0000:00:06.0, compute capability 9.0)")


def test_libcuda_outside_the_loaders_path_is_found_in_the_usual_directories(tmp_path: Path) -> None:
    fs = container(tmp_path, lib="/usr/local/nvidia/lib64/libcuda.so.1")
    loader = Loader(
        by_name=OSError(NOT_FOUND), by_path={"/usr/local/nvidia/lib64/libcuda.so.1": FakeLibCuda()}
    )
    code, lines = check(fs, loader)
    assert code == EXIT_OK and loader.asked == [None, "/usr/local/nvidia/lib64/libcuda.so.1"]
    assert (
        lines[1] == f"libcuda: /usr/local/nvidia/lib64/libcuda.so.1 (after: the loader's search: {NOT_FOUND})"
    )


def test_no_libcuda_and_no_device_nodes_names_what_the_toolkit_did_not_give(tmp_path: Path) -> None:
    code, lines = check(container(tmp_path, nodes=(), lib=None), Loader(by_name=OSError(NOT_FOUND)))
    assert code == EXIT_FAILED
    assert lines[0] == "device nodes: none; missing: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidiaN"
    assert lines[-1].startswith(
        "FAILED: libcuda.so.1 (the driver's CUDA library) is not in this container and no GPU device node either"
    )
    assert "Likely fix: the NVIDIA container toolkit did not give this container the driver" in lines[-1]
    assert len(lines) == 2


def test_an_unloadable_libcuda_is_named_with_the_loaders_reason(tmp_path: Path) -> None:
    short = OSError(f"{LIB}: file too short")
    code, lines = check(container(tmp_path), Loader(by_name=short, by_path={LIB: short}))
    assert code == EXIT_FAILED
    assert lines[-1].startswith(
        f"FAILED: libcuda.so.1 at {LIB} cannot be loaded (the loader's search: {short}; {short}). "
    )
    assert "Likely fix: the driver's library the toolkit mounted from the host is damaged" in lines[-1]


@pytest.mark.parametrize(
    ("call", "code", "nodes", "named", "fix"),
    [
        (
            "cuInit",
            100,
            ("dev/nvidiactl", "dev/nvidia-uvm"),
            "cuInit returned CUDA_ERROR_NO_DEVICE (100)",
            "the container was given no GPU device node (missing /dev/nvidiaN)",
        ),
        (
            "cuInit",
            100,
            ALL_NODES,
            "cuInit returned CUDA_ERROR_NO_DEVICE (100)",
            "the driver sees no usable GPU",
        ),
        (
            "cuInit",
            999,
            ("dev/nvidiactl", "dev/nvidia0"),
            "cuInit returned CUDA_ERROR_UNKNOWN (999)",
            "the container lacks /dev/nvidia-uvm",
        ),
        (
            "cuInit",
            803,
            ALL_NODES,
            "cuInit returned CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)",
            "another driver version than the loaded kernel module",
        ),
        # a code the driver cannot name: ours, from cuda.h's enum
        (
            "cuInit",
            802,
            ALL_NODES,
            "cuInit returned CUDA_ERROR_SYSTEM_NOT_READY (802)",
            "NVIDIA Fabric Manager",
        ),
        (
            "cuCtxCreate_v2",
            46,
            ALL_NODES,
            "cuCtxCreate_v2 returned CUDA_ERROR_DEVICE_UNAVAILABLE (46)",
            "Compute Mode",
        ),
        (
            "cuModuleLoadData",
            218,
            ALL_NODES,
            "cuModuleLoadData returned CUDA_ERROR_INVALID_PTX (218)",
            "could not compile our PTX (ISA 7.0, sm_50)",
        ),
        (
            "cuMemAlloc_v2",
            2,
            ALL_NODES,
            "cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY (2)",
            "GPU's memory",
        ),
        ("cuLaunchKernel", 719, ALL_NODES, "cuLaunchKernel returned CUDA_ERROR_LAUNCH_FAILED (719)", "Xid"),
        (
            "cuCtxSynchronize",
            700,
            ALL_NODES,
            "cuCtxSynchronize returned CUDA_ERROR_ILLEGAL_ADDRESS (700)",
            "Xid",
        ),
    ],
)
def test_each_failing_call_ends_with_its_error_and_a_fix(
    tmp_path: Path, call: str, code: int, nodes: tuple[str, ...], named: str, fix: str
) -> None:
    lib = FakeLibCuda(fail_at=call, code=code)
    exit_code, lines = check(container(tmp_path, nodes=nodes), Loader(by_name=lib))
    assert exit_code == EXIT_FAILED
    last = lines[-1]
    assert last.startswith(f"FAILED: {named}. Likely fix: ") and fix in last.split("Likely fix: ", 1)[1]
    assert f"{call}: {named.split(' returned ')[1]}" in lines  # the step itself, as it failed


def test_a_driver_that_counts_no_device(tmp_path: Path) -> None:
    code, lines = check(container(tmp_path), Loader(by_name=FakeLibCuda(devices=0)))
    assert code == EXIT_FAILED
    assert lines[-1].startswith(
        "FAILED: cuDeviceGetCount returned CUDA_ERROR_NO_DEVICE (100). Likely fix: the driver"
    )


def test_wrong_values_and_a_missing_entry_point(tmp_path: Path) -> None:
    code, lines = check(container(tmp_path), Loader(by_name=FakeLibCuda(wrong=True)))
    assert code == EXIT_FAILED and lines[-1].startswith(
        "FAILED: the kernel ran but 1 of 1024 values came back wrong."
    )
    code, lines = check(container(tmp_path), Loader(by_name=FakeLibCuda(lacks=("cuLaunchKernel",))))
    assert code == EXIT_FAILED and lines[-1].startswith("FAILED: libcuda lacks a call: ")
    assert f"Likely fix: {LOADER} is not a driver's libcuda" in lines[-1]


def test_the_command_on_a_machine_without_the_driver_exits_1_without_a_traceback() -> None:
    """The real command, as the workload pod runs it. Where this machine has no NVIDIA driver (the
    project's CI), it must say so in its last line; where one is installed, it must still end
    with its own verdict line and no traceback."""
    driver = any(
        Path(d, "libcuda.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
    )
    command = Path(sys.executable).with_name("gpu-operator")  # the console script, as in our image
    done = subprocess.run([str(command), "node", "cuda-check"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    if driver:
        assert done.returncode in (0, EXIT_FAILED) and last.startswith("cuda-check: "), done
        return
    assert done.returncode == EXIT_FAILED, done
    assert last.startswith(
        "cuda-check: FAILED: libcuda.so.1 (the driver's CUDA library) is not in this container"
    )
