"""doctor's troubleshooting checks on host-root fixtures: the kernel log's Xid and NVRM lines
(from /dev/kmsg in its record format, or a syslog file), kernel headers for a driver the
operator would build, a workload's CUDA version against the driver, and MIG changes held up by a
pending reset or by processes (nvidia-smi answered by a script under sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.doctor import troubleshoot
from gpu_operator.node.doctor.kernellog import kernel_log_findings, read_kernel_log
from gpu_operator.node.doctor.verdict import Finding, Severity
from gpu_operator.node.host.driver import DriverInfo, DriverSource
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.probe import probe
from gpu_operator.node.host.runner import HostRunner


def _kmsg(*messages: str) -> str:
    """Records as /dev/kmsg hands them out: `prio,seq,usec,flags;message`, continuation lines
    (` KEY=value`) after some."""
    out = []
    for seq, message in enumerate(messages):
        out.append(f"3,{1000 + seq},{5_000_000 + seq * 1000},-;{message}")
        if "Xid" in message:
            out.append(" SUBSYSTEM=pci")
    return "\n".join(out) + "\n"


LOG = (
    "NVRM: Xid (PCI:0000:41:00): 79, pid=0, name=kworker, GPU has fallen off the bus.",
    "NVRM: GPU at PCI:0000:41:00: GPU-3f1c has fallen off the bus.",
    "NVRM: Xid (PCI:0000:41:00): 79, pid=0, name=kworker, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:c1:00): 13, pid=4242, name=python, Graphics SM Warp Exception",
    "NVRM: Xid (PCI:0000:c1:00): 48, pid=4242, name=python, An uncorrectable double bit error",
    "NVRM: Xid (PCI:0000:c1:00): 999, pid=1, name=x, something new",
    "NVRM: API mismatch: the client has the version 550.127.05, but this kernel module has the version 535.183.01.",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
)


def _by_code(findings: list[Finding]) -> dict[str, Finding]:
    return {f.code: f for f in findings}


def test_xid_and_nvrm_lines_from_kmsg_become_findings(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    host.fs.write_text("/dev/kmsg", _kmsg(*LOG))
    found = _by_code(kernel_log_findings(host.fs))
    assert set(found) == {"xid-79", "xid-13", "xid-48", "xid-999", "gpu-off-bus", "driver-api-mismatch"}
    assert found["xid-79"].severity == Severity.ERROR and "41:00 " not in found["xid-79"].summary
    assert "0000:41:00: Xid 79" in found["xid-79"].summary and "(2 time(s))" in found["xid-79"].summary
    assert found["xid-79"].evidence == [f"/dev/kmsg: {LOG[2]}"] and "power-cycled" in found["xid-79"].fix
    assert found["xid-13"].severity == Severity.WARNING and "application" in found["xid-13"].summary
    assert found["xid-48"].severity == Severity.ERROR and "nvidia-smi -r -i 0000:c1:00" in found["xid-48"].fix
    assert found["xid-999"].severity == Severity.WARNING and "catalogue" in found["xid-999"].fix
    assert found["driver-api-mismatch"].severity == Severity.ERROR
    assert "535.183.01" in found["driver-api-mismatch"].evidence[0]
    for f in found.values():
        assert f.fix and f.evidence, f.code


def test_a_syslog_file_is_read_when_kmsg_is_not_there_and_silence_is_said(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    host.fs.write_text(
        "/var/log/kern.log", "\n".join(f"Nov 24 10:00:00 gpu-1 kernel: [ 5.1] {line}" for line in LOG[:1])
    )
    source, _ = read_kernel_log(host.fs) or ("", "")
    assert source == "/var/log/kern.log"
    assert [f.code for f in kernel_log_findings(host.fs)] == ["xid-79"]
    quiet = build_host("ubuntu-apt-driver")
    (finding,) = kernel_log_findings(quiet.fs)
    assert (finding.code, finding.severity) == ("kernel-log-unreadable", Severity.INFO)
    quiet.fs.write_text("/dev/kmsg", _kmsg("usb 1-1: new device"))
    assert kernel_log_findings(quiet.fs) == []  # read, nothing about the GPUs


def test_the_machines_own_kmsg_is_read_without_blocking() -> None:
    """/dev/kmsg is a character device whose reads block at the end unless opened non-blocking:
    this returns (the pytest timeout would end a blocked read), with text or None (no access)."""
    found = read_kernel_log(HostFS("/"))
    assert found is None or isinstance(found[1], str)


def test_kernel_headers_for_a_driver_the_operator_would_build(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("nouveau")
    report = probe(host.fs)
    assert report.driver.source == DriverSource.NONE
    (missing,) = troubleshoot.header_findings(host.fs, report.kernel, report.driver)
    assert missing.code == "kernel-headers-missing" and missing.severity == Severity.WARNING
    assert "linux-headers-5.15.0-119-generic" in missing.fix and "usePrecompiled" in missing.fix
    host.fs.mkdir("/usr/src/linux-headers-5.15.0-119-generic")
    host.fs.mkdir("/lib/modules/5.15.0-119-generic")
    host.fs.symlink("/lib/modules/5.15.0-119-generic/build", "/usr/src/linux-headers-5.15.0-119-generic")
    (present,) = troubleshoot.header_findings(host.fs, report.kernel, report.driver)
    assert present.code == "kernel-headers" and present.severity == Severity.INFO
    driver_on_host = probe(build_host("ubuntu-apt-driver").fs)
    assert troubleshoot.header_findings(host.fs, driver_on_host.kernel, driver_on_host.driver) == []


@pytest.mark.parametrize(
    ("given", "parsed"),
    [
        ("12.4", (12, 4)),
        ("12.4.1", (12, 4)),
        ("CUDA_VERSION=12.8.0", (12, 8)),
        ("NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=tesla,driver>=535,driver<536", (13, 0)),
        ("cuda>=11.8", (11, 8)),
    ],
)
def test_cuda_versions_are_read_from_what_images_carry(given: str, parsed: tuple[int, int]) -> None:
    assert troubleshoot.parse_cuda(given) == parsed


def test_a_text_without_a_cuda_version_is_refused_with_the_forms() -> None:
    with pytest.raises(ValueError, match="NVIDIA_REQUIRE_CUDA=cuda>=12.4"):
        troubleshoot.parse_cuda("latest")


@pytest.mark.parametrize(
    ("cuda", "driver", "code", "severity"),
    [
        ((12, 4), "550.127.05", "cuda-compatible", Severity.INFO),
        ((12, 8), "550.127.05", "cuda-minor-compat", Severity.WARNING),
        ((13, 0), "550.127.05", "cuda-driver-too-old", Severity.ERROR),
        ((13, 0), "580.65.06", "cuda-compatible", Severity.INFO),
        ((12, 2), "535.54.02", "cuda-minor-compat", Severity.WARNING),  # one patch below 12.2's minimum
        ((12, 0), "520.61.05", "cuda-driver-too-old", Severity.ERROR),
        ((14, 0), "580.65.06", "cuda-version-unknown", Severity.WARNING),
    ],
)
def test_a_workloads_cuda_against_the_driver(
    cuda: tuple[int, int], driver: str, code: str, severity: Severity
) -> None:
    info = DriverInfo(source=DriverSource.HOST, kernel_version=driver)
    (found,) = troubleshoot.cuda_findings(cuda, info)
    assert (found.code, found.severity) == (code, severity)
    if severity != Severity.INFO or code == "cuda-compatible":
        assert found.evidence


SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*)
    echo "00000000:41:00.0, Disabled, Enabled"
    echo "00000000:C1:00.0, Enabled, Disabled"
    echo "00000000:81:00.0, Enabled, Enabled" ;;
  --query-compute-apps=*)
    echo "00000000:41:00.0, 4242, python"
    echo "00000000:81:00.0, 77, dcgm" ;;
  *) echo "NVIDIA-SMI 550.127.05" ;;
esac
"""


def test_mig_changes_pending_a_reset_and_the_processes_holding_them(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver", executables={"/usr/bin/nvidia-smi": SMI})
    report = probe(host.fs)
    found = troubleshoot.mig_findings(HostRunner(host.fs, chroot=False), report.driver)
    by_gpu = {f.summary.split(": a MIG")[0]: f for f in found}
    assert set(by_gpu) == {"GPU 0000:41:00.0", "GPU 0000:c1:00.0"}  # 81:00.0 has nothing pending
    blocked, pending = by_gpu["GPU 0000:41:00.0"], by_gpu["GPU 0000:c1:00.0"]
    assert (blocked.code, blocked.severity) == ("mig-change-blocked", Severity.ERROR)
    assert "pid 4242 (python)" in blocked.evidence[1] and "nvidia-smi -r -i 0000:41:00.0" in blocked.fix
    assert (pending.code, pending.severity) == ("mig-pending-reset", Severity.WARNING)


def test_a_failing_nvidia_smi_is_said_not_guessed(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "ubuntu-apt-driver",
        executables={"/usr/bin/nvidia-smi": "#!/bin/sh\necho 'NVML: driver not loaded' >&2\nexit 9\n"},
    )
    (found,) = troubleshoot.mig_findings(HostRunner(host.fs, chroot=False), probe(host.fs).driver)
    assert found.code == "mig-query-failed" and "exited 9" in found.evidence[0]


def test_doctor_runs_the_checks(build_host, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPU_OPERATOR_NO_CHROOT", "1")
    host = build_host("ubuntu-apt-driver", executables={"/usr/bin/nvidia-smi": SMI})
    host.fs.write_text("/dev/kmsg", _kmsg(LOG[4]))
    root = str(Path(host.fs.root))
    result = CliRunner().invoke(
        app, ["doctor", "--host-root", root, "--json", "--cuda", "CUDA_VERSION=13.0.1"]
    )
    assert result.exit_code == 1, result.output
    codes = {f["code"]: f["severity"] for f in json.loads(result.output)["findings"]}
    assert codes["xid-48"] == codes["cuda-driver-too-old"] == codes["mig-change-blocked"] == "error"
    bad = CliRunner().invoke(app, ["doctor", "--host-root", root, "--cuda", "latest"])
    assert bad.exit_code == 2 and "NVIDIA_REQUIRE_CUDA" in bad.output
    quiet = CliRunner().invoke(app, ["doctor", "--host-root", root, "--json", "--no-commands"])
    assert "mig-change-blocked" not in {f["code"] for f in json.loads(quiet.output)["findings"]}


# -- the Node's MIG config and state (doctor --node) -------------------------------------------------


def test_mig_node_findings_from_the_nodes_labels_and_the_operators_order() -> None:
    from gpu_operator.node.doctor.troubleshoot import mig_node_findings

    assert mig_node_findings("n1", {"nvidia.com/gpu.present": "true"}, {}) == []
    applied = mig_node_findings(
        "n1", {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "success"}, {}
    )
    assert [(f.code, f.severity, f.summary) for f in applied] == [
        ("mig-node-state", Severity.INFO, "MIG config all-1g.10gb: success")
    ]
    labels = {
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/mig.config.state": "pending",
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
    }
    stuck = mig_node_findings(
        "n1",
        labels,
        {
            "nvidia.com/gpu-operator.mig.restore": "MIGChangeStuck clients: a/b",
            "nvidia.com/gpu-operator.mig.retry": "2 1700000000",
        },
    )
    assert [f.code for f in stuck] == ["mig-node-state", "mig-change-stuck"]
    assert stuck[0].evidence == [
        "Node n1: nvidia.com/mig.config=all-1g.10gb, nvidia.com/mig.config.state=pending",
        "paused for the MIG change: nvidia.com/gpu.deploy.device-plugin",
    ]
    assert stuck[1].summary == "the operator found this node's MIG change stuck (MIGChangeStuck)"
    assert stuck[1].evidence[-1] == "clients: a/b"
    assert stuck[1].fix == (
        "remove what kept the GPU clients from stopping (the pods named above), or reset the GPUs "
        "or reboot where none is named; the operator restored the paused clients and retries; "
        "2 retries so far"
    )
    failed = mig_node_findings(
        "n1", {"nvidia.com/mig.config": "x", "nvidia.com/mig.config.state": "failed"}, {}
    )
    assert [(f.code, f.severity) for f in failed] == [
        ("mig-node-state", Severity.INFO),
        ("mig-change-failed", Severity.WARNING),
    ]
