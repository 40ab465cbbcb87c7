"""The reference steps: find NVIDIA's tools and ask them (nvidia-smi -q -x, NVML, the CUDA driver).
They are asked only on the running system (host root /): a host tree's files answer for no GPU."""

from __future__ import annotations

import os
from typing import Any

from gpu_operator.node.gpucheck.cudacheck import NO_DEVICE, run_cuda_check
from gpu_operator.node.gpucheck.reference import nvml_report, parse_smi_xml
from gpu_operator.node.gpucheck.steps import Defect, State, Unavailable
from gpu_operator.node.gpucheck.tools import ON_PATH, Found, find_tools
from gpu_operator.node.host.pci import normalise_bus

SMI_TIMEOUT = 120.0


def _live(state: State) -> None:
    if not state.live:
        raise Unavailable(
            f"the host root {state.fs.root} is a host tree, not this machine's /: NVIDIA's tools "
            "answer only about the running system"
        )


def _real(state: State, found: Found) -> str | None:
    return str(state.fs.resolve(found.path)) if found.path else None


def tools_step(state: State) -> tuple[str, dict[str, Any]]:
    state.tools = tools = find_tools(state.fs)
    if state.live and tools.smi.path is None and (on_path := state.deps.which("nvidia-smi")):
        tools.smi = Found(on_path, ON_PATH)
    found = [
        f"{name} {f.path}"
        for name, f in (("nvidia-smi", tools.smi), ("libnvidia-ml", tools.nvml), ("libcuda", tools.cuda))
        if f.path
    ]
    summary = (
        (f"driver root {tools.driver_root}: " + ", ".join(found))
        if found
        else (f"no nvidia-smi, libnvidia-ml or libcuda under {', '.join(tools.searched)}")
    )
    return summary, tools.as_dict()


def smi_step(state: State) -> tuple[str, dict[str, Any]]:
    _live(state)
    smi = _real(state, state.tools.smi)
    if smi is None:
        raise Unavailable("nvidia-smi not found (see the tools step)")
    env = dict(os.environ)
    libdir = os.path.dirname(_real(state, state.tools.nvml) or "")
    if libdir:  # a driver outside the loader's path (/usr/local/nvidia/lib64): nvidia-smi needs its NVML
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    result = state.deps.runner(state.fs).run([smi, "-q", "-x"], root=None, timeout=SMI_TIMEOUT, env=env)
    if not result.ok:
        raise RuntimeError(result.summary())
    state.smi = report = parse_smi_xml(result.stdout)
    return (
        f"{len(report.gpus)} GPU(s), driver {report.driver_version}, CUDA {report.cuda_version}",
        report.as_dict(),
    )


def nvml_step(state: State) -> tuple[str, dict[str, Any]]:
    _live(state)
    nvml = state.deps.nvml()
    preloaded = _real(state, state.tools.nvml)
    if preloaded:
        try:
            state.deps.preload(preloaded)
        except OSError as err:
            preloaded = f"not loaded ({err})"
    try:
        report = nvml_report(nvml)
    except nvml.NVMLError as err:
        if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None):
            raise Unavailable(f"libnvidia-ml.so.1 not found by the loader ({err})") from None
        raise
    state.nvml = report
    details = report.as_dict() | {"library": preloaded or "libnvidia-ml.so.1 (loader's search)"}
    summary = f"{len(report.gpus)} GPU(s), driver {report.driver_version}, CUDA {report.cuda_version}"
    if report.unanswered:
        # NVML cannot name a lost GPU's bus: the GPUs our probe sees that NVML does not list are the ones
        listed = set(report.by_bus())
        missing = (
            sorted(g.address for g in state.report.gpus if g.address not in listed) if state.report else []
        )
        details["lost"] = missing
        summary += (
            f"; {len(report.unanswered)} GPU(s) do not answer (NVML index "
            f"{', '.join(f'{i}: {e}' for i, e in sorted(report.unanswered.items()))})"
            + (f": {', '.join(missing)}" if missing else "")
        )
    return summary, details


def cuda_step(state: State) -> tuple[str, dict[str, Any]]:
    _live(state)
    path = _real(state, state.tools.cuda)
    try:
        lib = state.deps.load_cuda(path)
    except OSError as err:
        raise Unavailable(f"libcuda not loadable ({err})") from None
    result = state.cuda = run_cuda_check(lib)
    details = result.as_dict() | {"library": path or "libcuda.so.1 (loader's search)"}
    if not result.ok:
        if (result.failed_call, result.error_code) == ("cuInit", NO_DEVICE):
            raise Unavailable(f"the CUDA driver sees no device ({result.error})")
        raise RuntimeError(result.error or f"{result.wrong} of {result.elements_checked} elements wrong")
    known = state.smi.by_bus() if state.smi else {}
    if known and normalise_bus(result.bus) not in known:
        raise Defect(f"CUDA device 0 is at {result.bus}, which nvidia-smi does not list", details)
    return (
        f"{result.name} ({result.bus}, sm {result.compute_capability}, CUDA {result.driver_version}): "
        f"kernel from PTX ran, {result.elements_checked} elements checked"
    ), details
