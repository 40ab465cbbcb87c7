"""Troubleshooting checks `doctor` runs besides the host probe's: a workload's CUDA version against
the driver, kernel headers for a driver the operator will build, and MIG changes held up (pending
a GPU reset, or GPUs still used by processes). Each returns findings with the fix.

The driver-to-CUDA table is NVIDIA's (CUDA Toolkit release notes: the minimum Linux driver of
each toolkit release); the MIG facts come from `nvidia-smi` queries run read-only on the host.
"""

from __future__ import annotations

import re

from gpu_operator.node.doctor.verdict import Finding, Severity, finding
from gpu_operator.node.host.driver import DriverInfo, DriverSource
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.pci import normalise_bus
from gpu_operator.node.host.runner import CommandRunner
from gpu_operator.vocabulary import MIG_CONFIG, MIG_CONFIG_STATE, MIG_PAUSED, MIG_RESTORE, MIG_RETRY

# CUDA release -> the oldest Linux driver it supports without the forward-compatibility package.
CUDA_MIN_DRIVER: dict[tuple[int, int], tuple[int, ...]] = {
    (11, 0): (450, 36, 6),
    (11, 4): (470, 42, 1),
    (11, 5): (495, 29, 5),
    (11, 6): (510, 39, 1),
    (11, 7): (515, 43, 4),
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}
_CUDA = re.compile(r"(?:cuda\s*>=\s*|CUDA_VERSION=|^)v?(\d+)\.(\d+)")
HEADER_DIRS = ("/lib/modules/{k}/build", "/usr/src/linux-headers-{k}", "/usr/src/kernels/{k}")


def parse_cuda(text: str) -> tuple[int, int]:
    """A workload's CUDA version from what an image says: `12.4`, `12.4.1`, `CUDA_VERSION=12.4.1`
    or NVIDIA_REQUIRE_CUDA's `cuda>=12.4 brand=...`."""
    value = text.split("=", 1)[1] if text.startswith("NVIDIA_REQUIRE_CUDA=") else text
    match = _CUDA.search(value.strip())
    if not match:
        raise ValueError(
            f"{text!r} names no CUDA version: give 12.4, CUDA_VERSION=12.4.1 or "
            "NVIDIA_REQUIRE_CUDA=cuda>=12.4"
        )
    return int(match.group(1)), int(match.group(2))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{p:02d}" if i == 2 and len(version) > 2 else str(p) for i, p in enumerate(version))


def cuda_findings(wanted: tuple[int, int], driver: DriverInfo) -> list[Finding]:
    cuda = f"{wanted[0]}.{wanted[1]}"
    if not driver.kernel_version:
        return [
            finding(
                "cuda-driver-unknown",
                Severity.INFO,
                f"CUDA {cuda} not checked: no loaded driver reports its version",
                ["/proc/driver/nvidia/version is absent"],
                "check again once the driver is loaded",
            )
        ]
    have = _version(driver.kernel_version)
    known = sorted(v for v in CUDA_MIN_DRIVER if v[0] == wanted[0] and v <= wanted)
    if not known:
        return [
            finding(
                "cuda-version-unknown",
                Severity.WARNING,
                f"CUDA {cuda} is not in doctor's table",
                [f"known: {', '.join(f'{a}.{b}' for a, b in CUDA_MIN_DRIVER)}"],
                "check NVIDIA's CUDA release notes for the minimum driver",
            )
        ]
    exact = CUDA_MIN_DRIVER.get(wanted) or CUDA_MIN_DRIVER[known[-1]]
    major_floor = CUDA_MIN_DRIVER[known[0]]
    evidence = [
        f"driver {driver.kernel_version} (/proc/driver/nvidia/version)",
        f"CUDA {cuda} needs driver >= {_dotted(exact)}; CUDA {wanted[0]}.x runs from {_dotted(major_floor)} "
        "with minor-version compatibility",
    ]
    if have >= exact:
        return [
            finding(
                "cuda-compatible",
                Severity.INFO,
                f"CUDA {cuda} workloads can run on driver {driver.kernel_version}",
                evidence,
            )
        ]
    fix = (
        f"upgrade the driver to >= {_dotted(exact)} (ClusterPolicy driver.version, or the host's "
        f"package), or use an image built for an older CUDA"
    )
    if have >= major_floor:
        return [
            finding(
                "cuda-minor-compat",
                Severity.WARNING,
                f"CUDA {cuda} is newer than driver "
                f"{driver.kernel_version} supports; it runs only through minor-version compatibility "
                "(no PTX JIT of newer code, no newer driver APIs)",
                evidence,
                fix,
            )
        ]
    return [
        finding(
            "cuda-driver-too-old",
            Severity.ERROR,
            f"CUDA {cuda} workloads cannot run on driver {driver.kernel_version}",
            evidence,
            fix + "; datacenter GPUs can also use NVIDIA's CUDA forward-compatibility package in the image",
        )
    ]


def header_findings(fs: HostFS, kernel: str, driver: DriverInfo, precompiled: bool = False) -> list[Finding]:
    """For a driver the operator will build on this host (no driver installed yet): the kernel
    headers it compiles against. Without them on the host, the driver container downloads them
    from the OS's package repositories, which fails for custom kernels and offline nodes."""
    if driver.source != DriverSource.NONE or not kernel or precompiled:
        return []
    tried = [d.format(k=kernel) for d in HEADER_DIRS]
    found = [d for d in tried if fs.is_dir(d)]
    if found:
        return [
            finding("kernel-headers", Severity.INFO, f"kernel headers for {kernel} are on the host", found)
        ]
    return [
        finding(
            "kernel-headers-missing",
            Severity.WARNING,
            f"no kernel headers for the running kernel {kernel}: the operator's driver container must fetch them",
            [f"none of {', '.join(tried)}"],
            f"make the OS package repositories reachable from the driver pod with a package for {kernel} "
            f"(linux-headers-{kernel} or kernel-devel-{kernel}), or install them on the host, or use "
            "precompiled driver images (driver.usePrecompiled: true) where NVIDIA publishes them for this kernel",
        )
    ]


def mig_findings(runner: CommandRunner, driver: DriverInfo) -> list[Finding]:
    """MIG mode changes waiting for a GPU reset, and the processes that keep the reset from happening."""
    if driver.smi_in_root is None:
        return []
    smi = driver.smi_in_root
    modes = runner.run(
        [smi, "--query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending", "--format=csv,noheader"],
        root=driver.run_root,
        timeout=30,
        env=driver.smi_env,
    )
    if not modes.ok:
        return [
            finding(
                "mig-query-failed",
                Severity.INFO,
                "MIG mode not checked: nvidia-smi failed",
                [modes.summary()],
            )
        ]
    pending = {}
    for row in _csv(modes.stdout):
        if len(row) == 3 and row[1] != row[2] and "N/A" not in row[1:]:
            pending[normalise_bus(row[0])] = f"{row[0]}: MIG mode {row[1]}, pending {row[2]}"
    if not pending:
        return []
    apps = runner.run(
        [smi, "--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader"],
        root=driver.run_root,
        timeout=30,
        env=driver.smi_env,
    )
    holders: dict[str, list[str]] = {}
    for row in _csv(apps.stdout) if apps.ok else []:
        if len(row) == 3 and normalise_bus(row[0]) in pending:
            holders.setdefault(normalise_bus(row[0]), []).append(f"pid {row[1]} ({row[2]})")
    out = []
    for bus, line in sorted(pending.items()):
        if holders.get(bus):
            out.append(
                finding(
                    "mig-change-blocked",
                    Severity.ERROR,
                    f"GPU {bus}: a MIG mode change waits for a reset that processes on the GPU prevent",
                    [line, f"using it: {', '.join(holders[bus])}"],
                    "stop them first (drain the node's GPU pods; stop DCGM, nvidia-persistenced and other host "
                    "services holding the GPU), then reset it (nvidia-smi -r -i ADDR) or let the MIG manager "
                    "apply nvidia.com/mig.config".replace("ADDR", bus),
                )
            )
        else:
            out.append(
                finding(
                    "mig-pending-reset",
                    Severity.WARNING,
                    f"GPU {bus}: a MIG mode change is pending a GPU reset",
                    [line],
                    f"reset the GPU (nvidia-smi -r -i {bus}) or reboot; the MIG manager does this when it "
                    "applies nvidia.com/mig.config",
                )
            )
    if not apps.ok:
        out.append(
            finding(
                "mig-holders-unknown", Severity.INFO, "processes on the GPUs not listed", [apps.summary()]
            )
        )
    return out


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def mig_node_findings(node: str, labels: dict[str, str], annotations: dict[str, str]) -> list[Finding]:
    """The Node's MIG config and state (what NVIDIA's MIG manager writes), and what the operator's MIG
    unit found: a change stuck (its restore order) or failed, with its retries."""
    config, state = labels.get(MIG_CONFIG), labels.get(MIG_CONFIG_STATE)
    if config is None and state is None:
        return []
    paused = sorted(k for k, v in labels.items() if v == MIG_PAUSED)
    evidence = [
        f"Node {node}: {MIG_CONFIG}={config or '(none)'}, {MIG_CONFIG_STATE}={state or '(not written yet)'}"
    ]
    evidence += [f"paused for the MIG change: {', '.join(paused)}"] if paused else []
    retry = annotations.get(MIG_RETRY, "").split()
    tries = (
        f"; {retry[0]} retr{'y' if retry[0] == '1' else 'ies'} so far" if retry and retry[0].isdigit() else ""
    )
    out = [
        finding(
            "mig-node-state",
            Severity.INFO,
            f"MIG config {config or '(none)'}: {state or 'not applied yet'}",
            evidence,
        )
    ]
    order = annotations.get(MIG_RESTORE)
    if order:
        reason, _, why = order.partition(" ")
        out.append(
            finding(
                "mig-change-stuck",
                Severity.WARNING,
                f"the operator found this node's MIG change stuck ({reason})",
                [*evidence, why],
                "remove what kept the GPU clients from stopping (the pods named above), or reset the "
                f"GPUs or reboot where none is named; the operator restored the paused clients and retries{tries}",
            )
        )
    elif state == "failed":
        out.append(
            finding(
                "mig-change-failed",
                Severity.WARNING,
                f"the MIG manager could not apply {config}",
                evidence,
                "`gpu-operator status` shows the node's NvidiaMIGReady reason: InvalidMIGConfig lists the valid "
                "names; otherwise the MIG manager's log says why (a layout these GPUs refuse, a reset or reboot "
                f"required); the operator retries{tries}",
            )
        )
    return out
