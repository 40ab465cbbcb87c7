"""Stand-ins for what `node gpu-check` asks outside Python: nvidia-smi (a CommandRunner), NVML (a module
with pynvml's calls) and libcuda (an object with the driver API's calls, ctypes arguments and all)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpu_operator.node.gpucheck.steps import Deps
from gpu_operator.node.host.runner import CommandResult

SMI_XML = Path(__file__).parents[2] / "fixtures" / "nvidia-smi" / "h100-passthrough.xml"


class FakeSmi:
    """nvidia-smi: `-q -x` prints `xml`; a bare call (the validator, the exporter) answers; doctor's MIG query
    answers in CSV from the same GPUs."""

    def __init__(self, xml: str, buses: Sequence[str] = ("00000000:00:06.0",)) -> None:
        self.xml, self.buses = xml, buses
        self.calls: list[list[str]] = []

    def run(
        self, argv: Sequence[str], *, root: str | None = "/", timeout: float = 60.0, env: Any = None
    ) -> CommandResult:
        self.calls.append(list(argv))
        if list(argv[1:]) == ["-q", "-x"]:
            return CommandResult(tuple(argv), 0, self.xml)
        if any(a.startswith("--query-gpu=") for a in argv):
            return CommandResult(tuple(argv), 0, "".join(f"{b}, Disabled, Disabled\n" for b in self.buses))
        return CommandResult(tuple(argv), 0, "")


NVML_ERROR_LIBRARY_NOT_FOUND = 12  # pynvml's value


class NVMLError(Exception):
    """pynvml's error: the NVML return code in `value`."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(
    driver: str = "580.159.04",
    cuda: int = 13000,
    gpus: Sequence[tuple[str, int]] = (("00000000:00:06.0", 0x233010DE),),
    numa_mask: int = 1,
    fail: Exception | None = None,
) -> Any:
    """A pynvml stand-in: the calls nvml_report makes, answering for `gpus` (bus, pciDeviceId)."""

    def init() -> None:
        if fail is not None:
            raise fail

    return SimpleNamespace(
        NVMLError=NVMLError,
        NVML_ERROR_LIBRARY_NOT_FOUND=NVML_ERROR_LIBRARY_NOT_FOUND,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlSystemGetCudaDriverVersion=lambda: cuda,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=gpus[h][0].encode(), pciDeviceId=gpus[h][1]),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-fake-{h}",
        nvmlDeviceGetMigMode=lambda h: (0, 0),
        nvmlDeviceGetVirtualizationMode=lambda h: 1,
        nvmlDeviceGetMemoryAffinity=lambda h, size, scope: [numa_mask],
    )


def _out(arg: Any) -> Any:
    """The object behind ctypes.byref(...)."""
    return arg._obj


class FakeLibCuda:
    """libcuda's calls the check makes, with their ctypes arguments: the kernel's effect is played in Python
    (data[i] * 3 + 7) from the parameters it was given, so the marshalling is what is tested."""

    def __init__(
        self,
        fail_at: str | None = None,
        wrong: bool = False,
        bus: str = "0000:00:06.0",
        lacks: tuple[str, ...] = (),
        code: int = 218,
        devices: int = 1,
    ) -> None:
        self.lacks = lacks
        self.calls: list[str] = []
        self.fail_at, self.wrong, self.bus, self.code, self.devices = fail_at, wrong, bus, code, devices
        self.memory: dict[int, list[int]] = {}
        self.ptx = b""
        self.launch: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("cu") or name in self.lacks:
            raise AttributeError(f"undefined symbol: {name}")
        impl = getattr(self, f"_{name}", None)

        def call(*args: Any) -> int:
            if name != "cuGetErrorName":
                self.calls.append(name)
            if name == self.fail_at:
                return self.code  # default 218, CUDA_ERROR_INVALID_PTX
            return impl(*args) if impl else 0

        return call

    # the names a real libcuda gives (cuda.h's cudaError_enum); others: as the driver, INVALID_VALUE
    NAMES = {
        100: b"CUDA_ERROR_NO_DEVICE",
        218: b"CUDA_ERROR_INVALID_PTX",
        803: b"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        999: b"CUDA_ERROR_UNKNOWN",
    }

    def _cuGetErrorName(self, code: int, out: Any) -> int:
        if code not in self.NAMES:
            return 1  # CUDA_ERROR_INVALID_VALUE: a code this driver does not know
        _out(out).value = self.NAMES[code]
        return 0

    def _cuDriverGetVersion(self, out: Any) -> int:
        _out(out).value = 13000
        return 0

    def _cuDeviceGetCount(self, out: Any) -> int:
        _out(out).value = self.devices
        return 0

    def _cuDeviceGetName(self, buf: Any, size: Any, dev: Any) -> int:
        buf.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def _cuDeviceGetPCIBusId(self, buf: Any, size: Any, dev: Any) -> int:
        buf.value = self.bus.encode()
        return 0

    def _cuDeviceGetAttribute(self, out: Any, attribute: Any, dev: Any) -> int:
        _out(out).value = {75: 9, 76: 0}[attribute.value]
        return 0

    def _cuCtxCreate_v2(self, out: Any, flags: Any, dev: Any) -> int:
        _out(out).value = 0x1000
        return 0

    def _cuDevicePrimaryCtxRetain(self, out: Any, dev: Any) -> int:
        _out(out).value = 0x1000
        return 0

    def _cuModuleLoadData(self, out: Any, image: Any) -> int:
        self.ptx = image.value
        _out(out).value = 0x2000
        return 0

    def _cuModuleGetFunction(self, out: Any, module: Any, name: Any) -> int:
        self.launch["name"] = name.value
        _out(out).value = 0x3000
        return 0

    def _cuMemAlloc_v2(self, out: Any, size: Any) -> int:
        _out(out).value = 0x7F0000
        self.memory[0x7F0000] = [0] * (size.value // 4)
        return 0

    def _cuMemcpyHtoD_v2(self, dptr: Any, host: Any, size: Any) -> int:
        self.memory[dptr.value] = list(host)[: size.value // 4]
        return 0

    def _cuLaunchKernel(
        self,
        fn: Any,
        gx: Any,
        gy: Any,
        gz: Any,
        bx: Any,
        by: Any,
        bz: Any,
        shared: Any,
        stream: Any,
        params: Any,
        extra: Any,
    ) -> int:
        data = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64)).contents.value
        n = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_uint32)).contents.value
        self.launch |= {"grid": gx.value, "block": bx.value, "n": n, "data": data}
        buf = self.memory[data]
        for i in range(min(n, gx.value * bx.value)):
            buf[i] = (buf[i] * 3 + (8 if self.wrong and i == 5 else 7)) & 0xFFFFFFFF
        return 0

    def _cuMemcpyDtoH_v2(self, host: Any, dptr: Any, size: Any) -> int:
        for i, v in enumerate(self.memory[dptr.value][: size.value // 4]):
            host[i] = v
        return 0


def gpu_deps(
    xml: str | None = None, *, nvml: Any = None, cuda: FakeLibCuda | None = None, smi: FakeSmi | None = None
) -> Deps:
    """Deps of a machine with one H100 (the fixture XML), NVIDIA's tools asked as on a real host."""
    runner = smi or FakeSmi(xml if xml is not None else SMI_XML.read_text())
    lib = cuda or FakeLibCuda()
    return Deps(
        runner=lambda fs: runner,
        nvml=lambda: nvml or fake_nvml(),
        preload=lambda path: None,
        load_cuda=lambda path: lib,
        which=lambda name: None,
        live=True,
    )


def no_gpu_deps() -> Deps:
    """Deps of a machine without NVIDIA's driver: nothing found, nothing loads."""

    def no_cuda(path: str | None) -> Any:
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    def nvml() -> Any:
        return fake_nvml(fail=NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND))

    return Deps(
        runner=lambda fs: FakeSmi(""),
        nvml=nvml,
        preload=lambda path: None,
        load_cuda=no_cuda,
        which=lambda name: None,
        live=True,
    )
