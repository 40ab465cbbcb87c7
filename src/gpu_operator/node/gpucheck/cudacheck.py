"""A CUDA check that needs no CUDA image: the CUDA driver API (libcuda, part of the driver) through
ctypes. It initialises the driver, creates a context on GPU 0, loads a kernel from PTX text of ours
(the driver JIT-compiles it for whatever GPU this is), runs it over a small buffer, copies the
result back and checks every element; then frees what it made, in reverse order.

The calls and their C signatures are NVIDIA's (cuda.h, the CUDA Driver API reference); the _v2
entry points are the ones the headers have mapped the plain names to since CUDA 3.2/4.0 and that
drivers keep exporting. Nothing here changes the GPU's configuration.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

# Each thread i < n: data[i] = data[i] * 3 + 7 (32-bit unsigned).
KERNEL = "scale_add"
PTX = """\
.version 7.0
.target sm_50
.address_size 64

.visible .entry scale_add(
    .param .u64 scale_add_data,
    .param .u32 scale_add_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [scale_add_data];
    ld.param.u32 %r1, [scale_add_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r6, [%rd4];
    mad.lo.s32 %r7, %r6, 3, 7;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}
"""
ELEMENTS = 1024
THREADS = 256
CC_MAJOR, CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


def expected(values: list[int]) -> list[int]:
    return [(v * 3 + 7) & 0xFFFFFFFF for v in values]


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {code} ({name})")
        self.call, self.code, self.name = call, code, name


# The codes whose name we give when the driver cannot (cuGetErrorName missing or failing), from
# NVIDIA's cuda.h enum cudaError_enum (as in NVIDIA/cuda-python cuda_bindings cydriver.pxd.in).
ERROR_NAMES = {
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    218: "CUDA_ERROR_INVALID_PTX",
    221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}
NO_DEVICE = 100


@dataclass
class CudaResult:
    ok: bool = False
    driver_version: str = ""
    devices: int = 0
    name: str = ""
    bus: str = ""
    compute_capability: str = ""
    elements_checked: int = 0
    wrong: int = 0
    calls: list[str] = field(default_factory=list)
    error: str = ""
    # the failed call, its CUresult and that code's name (empty/0 when no call failed)
    failed_call: str = ""
    error_code: int = 0
    error_name: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CudaDriver:
    """One run of the check over a loaded libcuda (a ctypes CDLL, or a stand-in with the same calls).
    `log` is told each call's outcome as it returns (the container command prints them)."""

    def __init__(self, lib: Any, log: Callable[[str], None] | None = None) -> None:
        self.lib = lib
        self.log = log or (lambda line: None)
        self.result = CudaResult()
        self._undo: list[tuple[str, Callable[[], Any]]] = []

    def _call(self, name: str, *args: Any) -> None:
        self.result.calls.append(name)
        code = int(getattr(self.lib, name)(*args))
        if code != 0:
            error = self._error_name(code)
            self.log(f"{name}: {error} ({code})")
            raise CudaError(name, code, error)
        self.log(f"{name}: CUDA_SUCCESS")

    def _error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        try:
            if int(self.lib.cuGetErrorName(code, ctypes.byref(text))) == 0 and text.value:
                return text.value.decode(errors="replace")
        except (AttributeError, TypeError, ValueError):
            pass
        return ERROR_NAMES.get(code, "unknown error")

    def run(self) -> CudaResult:
        try:
            self._run()
            self.result.ok = self.result.wrong == 0 and self.result.elements_checked == ELEMENTS
        except CudaError as err:
            self.result.error = str(err)
            self.result.failed_call, self.result.error_code, self.result.error_name = (
                err.call,
                err.code,
                err.name,
            )
        except AttributeError as err:  # an entry point this libcuda does not export
            self.result.error = f"libcuda lacks a call: {err}"
        finally:
            self._cleanup()
        return self.result

    def _cleanup(self) -> None:
        while self._undo:
            name, undo = self._undo.pop()
            self.result.calls.append(name)
            try:
                undo()
            except Exception as err:  # noqa: BLE001 - a failed cleanup is reported, the rest still runs
                self.result.error = self.result.error or f"{name} failed: {err}"

    def _run(self) -> None:
        res = self.result
        self._call("cuInit", ctypes.c_uint(0))
        version, count = ctypes.c_int(0), ctypes.c_int(0)
        self._call("cuDriverGetVersion", ctypes.byref(version))
        res.driver_version = f"{version.value // 1000}.{version.value % 1000 // 10}"
        self._call("cuDeviceGetCount", ctypes.byref(count))
        res.devices = count.value
        self.log(f"driver supports CUDA {res.driver_version}; {count.value} device(s)")
        if count.value < 1:  # the driver answered, but counts no device: CUDA's own code for that
            raise CudaError("cuDeviceGetCount", NO_DEVICE, ERROR_NAMES[NO_DEVICE])
        device = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(0))
        name, bus = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64)
        self._call("cuDeviceGetName", name, ctypes.c_int(256), device)
        res.name = name.value.decode(errors="replace")
        self._call("cuDeviceGetPCIBusId", bus, ctypes.c_int(64), device)
        res.bus = bus.value.decode(errors="replace")
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._call("cuDeviceGetAttribute", ctypes.byref(major), ctypes.c_int(CC_MAJOR), device)
        self._call("cuDeviceGetAttribute", ctypes.byref(minor), ctypes.c_int(CC_MINOR), device)
        res.compute_capability = f"{major.value}.{minor.value}"
        self.log(f"device 0: {res.name}, PCI {res.bus}, compute capability {res.compute_capability}")

        context = ctypes.c_void_p()
        if hasattr(self.lib, "cuCtxCreate_v2"):
            self._call("cuCtxCreate_v2", ctypes.byref(context), ctypes.c_uint(0), device)
            self._undo.append(("cuCtxDestroy_v2", lambda: self._call("cuCtxDestroy_v2", context)))
        else:  # a driver without the old entry point: the device's primary context, as the runtime uses
            self._call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
            self._undo.append(
                ("cuDevicePrimaryCtxRelease_v2", lambda: self._call("cuDevicePrimaryCtxRelease_v2", device))
            )
            self._call("cuCtxSetCurrent", context)
        module = ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(PTX.encode()))
        self._undo.append(("cuModuleUnload", lambda: self._call("cuModuleUnload", module)))
        function = ctypes.c_void_p()
        self._call("cuModuleGetFunction", ctypes.byref(function), module, ctypes.c_char_p(KERNEL.encode()))

        size = ELEMENTS * 4
        values = [i * 2654435761 & 0xFFFFFFFF for i in range(ELEMENTS)]
        host = (ctypes.c_uint32 * ELEMENTS)(*values)
        dptr = ctypes.c_uint64(0)
        self._call("cuMemAlloc_v2", ctypes.byref(dptr), ctypes.c_size_t(size))
        self._undo.append(("cuMemFree_v2", lambda: self._call("cuMemFree_v2", dptr)))
        self._call("cuMemcpyHtoD_v2", dptr, host, ctypes.c_size_t(size))

        n = ctypes.c_uint32(ELEMENTS)
        params = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(dptr), ctypes.c_void_p), ctypes.cast(ctypes.byref(n), ctypes.c_void_p)
        )
        blocks = (ELEMENTS + THREADS - 1) // THREADS
        self._call(
            "cuLaunchKernel",
            function,
            ctypes.c_uint(blocks),
            ctypes.c_uint(1),
            ctypes.c_uint(1),
            ctypes.c_uint(THREADS),
            ctypes.c_uint(1),
            ctypes.c_uint(1),
            ctypes.c_uint(0),
            None,
            params,
            None,
        )
        self._call("cuCtxSynchronize")
        out = (ctypes.c_uint32 * ELEMENTS)()
        self._call("cuMemcpyDtoH_v2", out, dptr, ctypes.c_size_t(size))
        want = expected(values)
        res.elements_checked = ELEMENTS
        res.wrong = sum(1 for got, w in zip(out, want, strict=True) if got != w)
        self.log(f"kernel {KERNEL} over {ELEMENTS} values: {ELEMENTS - res.wrong} right, {res.wrong} wrong")


def load_libcuda(path: str | None) -> Any:
    """libcuda by its real path where we found it, else by soname through the loader's search."""
    return ctypes.CDLL(path or "libcuda.so.1")


def run_cuda_check(lib: Any, log: Callable[[str], None] | None = None) -> CudaResult:
    return CudaDriver(lib, log).run()
