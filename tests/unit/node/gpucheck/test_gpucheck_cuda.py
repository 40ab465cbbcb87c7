"""The CUDA driver-API check's calls, against a stand-in libcuda that plays the kernel from the arguments
it is given: the order of the calls, the kernel parameters as pointers, the result checked element by
element, and the cleanup in reverse order whatever fails."""

from __future__ import annotations

from gpu_operator.node.gpucheck.cudacheck import ELEMENTS, KERNEL, PTX, THREADS, run_cuda_check
from tests.unit.node.gpucheck_fakes import FakeLibCuda

SETUP = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetAttribute",
    "cuDeviceGetAttribute",
    "cuCtxCreate_v2",
    "cuModuleLoadData",
]


def test_the_kernel_runs_and_every_element_is_checked() -> None:
    lib = FakeLibCuda()
    result = run_cuda_check(lib)
    assert result.ok and result.wrong == 0 and result.elements_checked == ELEMENTS
    assert lib.calls == [
        *SETUP,
        "cuModuleGetFunction",
        "cuMemAlloc_v2",
        "cuMemcpyHtoD_v2",
        "cuLaunchKernel",
        "cuCtxSynchronize",
        "cuMemcpyDtoH_v2",
        "cuMemFree_v2",
        "cuModuleUnload",
        "cuCtxDestroy_v2",
    ]
    assert lib.ptx == PTX.encode() and lib.launch["name"] == KERNEL.encode()
    assert lib.launch["n"] == ELEMENTS and lib.launch["data"] == 0x7F0000
    assert lib.launch["grid"] * lib.launch["block"] >= ELEMENTS and lib.launch["block"] == THREADS
    assert (result.name, result.bus, result.compute_capability, result.driver_version) == (
        "NVIDIA H100 80GB HBM3",
        "0000:00:06.0",
        "9.0",
        "13.0",
    )


def test_one_wrong_element_fails_the_check() -> None:
    result = run_cuda_check(FakeLibCuda(wrong=True))
    assert not result.ok and result.wrong == 1


def test_a_failed_module_load_names_the_error_and_destroys_the_context() -> None:
    lib = FakeLibCuda(fail_at="cuModuleLoadData")
    result = run_cuda_check(lib)
    assert not result.ok
    assert result.error == "cuModuleLoadData returned 218 (CUDA_ERROR_INVALID_PTX)"
    assert lib.calls == [*SETUP, "cuCtxDestroy_v2"]


def test_a_failed_launch_frees_everything_it_made_in_reverse_order() -> None:
    lib = FakeLibCuda(fail_at="cuLaunchKernel")
    result = run_cuda_check(lib)
    assert not result.ok and result.elements_checked == 0
    assert lib.calls[-3:] == ["cuMemFree_v2", "cuModuleUnload", "cuCtxDestroy_v2"]


def test_a_driver_without_cuctxcreate_v2_uses_the_primary_context() -> None:
    lib = FakeLibCuda(lacks=("cuCtxCreate_v2",))
    result = run_cuda_check(lib)
    assert result.ok
    assert lib.calls[8:11] == ["cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuModuleLoadData"]
    assert lib.calls[-1] == "cuDevicePrimaryCtxRelease_v2"


def test_a_missing_entry_point_is_reported_not_raised() -> None:
    result = run_cuda_check(FakeLibCuda(lacks=("cuLaunchKernel",)))
    assert not result.ok and result.error.startswith("libcuda lacks a call")
