"""`node gpu-check` without a GPU: a GPU-less machine's report, host trees (NVIDIA's tools not
available), and a one-H100 VM played by a host tree plus stand-ins for nvidia-smi, NVML and libcuda:
agreement, a mismatch flagged as a defect, doctor contradicted, the driver under /usr/local/nvidia."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.gpucheck.check import EXIT_DEFECTS, EXIT_NO_GPU, EXIT_OK, run_check
from gpu_operator.node.gpucheck.compare import DEFECTS, MATCH, MISMATCH, MISSED
from gpu_operator.node.gpucheck.compare import NA as NA_VERDICT
from gpu_operator.node.gpucheck.overlay import CheckFS
from gpu_operator.node.gpucheck.reference import ReferenceError, parse_smi_xml
from gpu_operator.node.gpucheck.steps import DEFECT, FAILED, NA, OK
from gpu_operator.node.gpucheck.tools import find_tools
from tests.unit.node.conftest import BuildHost
from tests.unit.node.gpucheck_fakes import SMI_XML, FakeLibCuda, FakeSmi, fake_nvml, gpu_deps, no_gpu_deps

REFERENCE_STEPS = ("nvidia-smi -q -x", "NVML", "CUDA driver API")
# One H100 passed through to a VM, as the fixture XML describes it, the host driver 580.159.04.
VM_GPU = {
    "address": "0000:00:06.0",
    "vendor": "10de",
    "device": "2330",
    "class": "030200",
    "driver": "nvidia",
}
USR_LOCAL_NVIDIA = {
    # like the real one, it answers only when the loader finds libnvidia-ml (not in the host's ld cache)
    "executables": {
        "/usr/local/nvidia/bin/nvidia-smi": '#!/bin/sh\ncase "$LD_LIBRARY_PATH" in\n'
        "*/usr/local/nvidia/lib64*) exit 0 ;;\nesac\n"
        'echo "NVIDIA-SMI couldn\'t find libnvidia-ml.so library in your system."\nexit 12\n'
    },
    "files": {"/usr/local/nvidia/lib64/libnvidia-ml.so.1": "", "/usr/local/nvidia/lib64/libcuda.so.1": ""},
}


# A KVM guest's CPU flags, and the GPU's configuration space read whole: no vendor capability, so our
# guest probe calls it passed through (node/host/guest.py)
GUEST_FILES = {
    "/proc/cpuinfo": "processor\t: 0\nflags\t\t: fpu vme de pse msr hypervisor\n",
    f"/sys/bus/pci/devices/{VM_GPU['address']}/config": "\0" * 256,
}


def vm_host(build_host: BuildHost, **changes: Any) -> Path:
    files = {**GUEST_FILES, **changes.pop("files", {})}
    spec = {
        "devices": [VM_GPU],
        "pci_drivers": ["nvidia"],
        "driver_version": "580.159.04",
        "files": files,
        **changes,
    }
    return build_host("h100-nvidia-bound", **spec).fs.root


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + str(path.readlink())
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def statuses(report: Any) -> dict[str, str]:
    return {s.name: s.status for s in report.steps}


def rows(report: Any) -> dict[str, dict[str, str]]:
    return {r["fact"]: r for r in report.step("probe vs NVIDIA").details.get("rows", [])}


def test_a_machine_without_nvidia_gpu_gets_a_plain_report(build_host: BuildHost, tmp_path: Path) -> None:
    root = build_host("cpu-only").fs.root
    report = run_check(str(root), tmp_path / "out", deps=no_gpu_deps())
    assert report.exit_code == EXIT_NO_GPU
    got = statuses(report)
    assert all(got[name] == NA for name in REFERENCE_STEPS)
    assert got["probe"] == OK and got["doctor"] == OK and got["validator: driver"] == NA
    assert FAILED not in got.values()
    assert [f["code"] for f in report.step("doctor").details["findings"]] == ["no-nvidia-gpu"]


def test_the_command_exits_3_without_a_gpu_and_writes_its_report(
    build_host: BuildHost, tmp_path: Path
) -> None:
    root = build_host("cpu-only").fs.root
    result = CliRunner().invoke(
        app, ["node", "gpu-check", "--host-root", str(root), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == EXIT_NO_GPU
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not an error escaping
    data = json.loads((tmp_path / "o" / "report.json").read_text())
    assert data["exit_code"] == EXIT_NO_GPU and data["live"] is False
    assert [s["name"] for s in data["steps"]][:2] == ["nvidia tools", "probe"]


def test_a_host_tree_runs_our_agents_and_writes_nothing_into_it(
    build_host: BuildHost, tmp_path: Path
) -> None:
    root = build_host("h100-nvidia-bound").fs.root
    before = tree_digest(root)
    report = run_check(str(root), tmp_path / "out")
    assert tree_digest(root) == before
    assert report.live is False and report.exit_code == EXIT_OK
    got = statuses(report)
    assert all(got[name] == NA for name in REFERENCE_STEPS)
    assert got["probe"] == OK and got["doctor"] == OK and got["node-status exporter"] == OK
    validator = report.step("validator: driver")
    assert validator.status == OK
    assert validator.details["driver_ready"]["NVIDIA_DRIVER_ROOT"] == "/"
    assert (tmp_path / "out" / "validations" / "driver-ready").is_file()
    metrics = report.step("node-status exporter").details["metrics"]
    assert metrics["gpu_operator_nvidia_pci_devices_total"] == 8.0
    assert metrics["gpu_operator_node_driver_ready"] == 1.0
    tools = report.step("nvidia tools").details
    assert tools["driver_root"] == "/" and tools["nvidia_smi"]["path"] == "/usr/bin/nvidia-smi"


def test_nvidia_smi_xml_is_read_field_by_field() -> None:
    smi = parse_smi_xml(SMI_XML.read_text())
    assert (smi.driver_version, smi.cuda_version) == ("580.159.04", "13.0")
    [gpu] = smi.gpus
    assert gpu.bus == "0000:00:06.0" and gpu.vendor_device == "10de:2330"
    assert gpu.product == "NVIDIA H100 80GB HBM3" and gpu.virtualization == "Pass-Through"
    assert (gpu.mig_current, gpu.mig_pending) == ("Disabled", "Disabled")


@pytest.mark.parametrize("text", ["NVIDIA-SMI has failed", "<nvidia_smi_log><gpu/></nvidia_smi_log>", "<x/>"])
def test_what_is_not_nvidia_smi_xml_is_refused_by_name(text: str) -> None:
    with pytest.raises(ReferenceError):
        parse_smi_xml(text)


def test_a_vm_whose_agents_agree_with_nvidia(build_host: BuildHost, tmp_path: Path) -> None:
    report = run_check(str(vm_host(build_host)), tmp_path / "out", deps=gpu_deps())
    got = statuses(report)
    assert report.exit_code == EXIT_OK, got
    assert set(got.values()) <= {OK, NA} and got["CUDA driver API"] == OK and got["NVML"] == OK
    facts = rows(report)
    assert not [f for f, r in facts.items() if r["verdict"] in DEFECTS]
    assert facts["0000:00:06.0 PCI ids"]["verdict"] == MATCH
    assert facts["driver version"]["verdict"] == MATCH
    assert facts["0000:00:06.0 NUMA node"]["verdict"] == MATCH
    assert facts["0000:00:06.0 virtualization"]["ours"] == "passthrough"
    assert facts["0000:00:06.0 virtualization"]["verdict"] == MATCH
    assert report.step("CUDA driver API").details["elements_checked"] == 1024


def test_a_driver_version_nvidia_smi_contradicts_is_a_defect(build_host: BuildHost, tmp_path: Path) -> None:
    tree = ET.parse(SMI_XML)
    version = tree.getroot().find("driver_version")
    assert version is not None
    version.text = "580.82.07"
    xml = ET.tostring(tree.getroot(), encoding="unicode")
    report = run_check(
        str(vm_host(build_host)), tmp_path / "out", deps=gpu_deps(xml, nvml=fake_nvml(driver="580.82.07"))
    )
    assert report.exit_code == EXIT_DEFECTS
    assert report.step("probe vs NVIDIA").status == DEFECT
    assert rows(report)["driver version"]["verdict"] == MISMATCH


def test_gpus_nvidia_smi_lists_but_sysfs_hides_contradict_doctor(
    build_host: BuildHost, tmp_path: Path
) -> None:
    # a sandbox that passes the GPU and the driver through but shows no PCI devices (gVisor's shape)
    root = build_host("cpu-only", **USR_LOCAL_NVIDIA).fs.root
    report = run_check(str(root), tmp_path / "out", deps=gpu_deps())
    assert report.exit_code == EXIT_DEFECTS  # a GPU is there: not "no GPU"
    assert rows(report)["GPUs"]["verdict"] == MISSED
    assert rows(report)["0000:00:06.0 present"]["verdict"] == MISSED
    doctor = report.step("doctor")
    assert doctor.status == DEFECT
    contradicted = {f["code"]: f["contradicted_by_nvidia"] for f in doctor.details["findings"]}
    assert contradicted["no-nvidia-gpu"]
    assert report.step("validator: driver").status == DEFECT


def test_a_driver_under_usr_local_nvidia_is_found_by_nvidia_and_by_us(
    build_host: BuildHost, tmp_path: Path
) -> None:
    """The driver mounted read-only at /usr/local/nvidia (bin/, lib64/: GKE's layout, and a VM's or
    container's given a GPU so): our probe finds it there too, its root is that directory, and the
    validator runs its nvidia-smi with the root's lib64 for the loader."""
    root = vm_host(build_host, **USR_LOCAL_NVIDIA)
    assert find_tools(CheckFS(root, "/run/x", tmp_path / "s")).driver_root == "/usr/local/nvidia"
    report = run_check(str(root), tmp_path / "out", deps=gpu_deps())
    assert report.step("nvidia tools").details["libcuda"]["path"] == "/usr/local/nvidia/lib64/libcuda.so.1"
    facts = rows(report)
    assert facts["driver root"]["verdict"] == MATCH, facts["driver root"]
    assert facts["nvidia-smi path"]["verdict"] == MATCH, facts["nvidia-smi path"]
    codes = {f["code"] for f in report.step("doctor").details["findings"]}
    assert "driver-userspace-missing" not in codes
    assert report.step("validator: driver").status == OK, report.step("validator: driver").details


def test_one_failing_step_leaves_the_others_running(build_host: BuildHost, tmp_path: Path) -> None:
    broken = fake_nvml(fail=RuntimeError("the bindings broke"))
    report = run_check(str(vm_host(build_host)), tmp_path / "out", deps=gpu_deps(nvml=broken))
    got = statuses(report)
    assert got["NVML"] == FAILED and report.step("NVML").details["traceback"]
    assert got["CUDA driver API"] == OK and got["kernel log"] in (OK, NA) and got["doctor"] == OK
    assert report.exit_code == EXIT_DEFECTS


@pytest.mark.parametrize(("call", "code", "status"), [("cuInit", 100, NA), ("cuCtxCreate_v2", 100, FAILED)])
def test_a_cuda_driver_without_a_device_is_not_available_only_at_init(
    build_host: BuildHost, tmp_path: Path, call: str, code: int, status: str
) -> None:
    """cuInit's CUDA_ERROR_NO_DEVICE: the CUDA driver sees no GPU here (n/a); the same code later is a failure."""
    deps = gpu_deps(cuda=FakeLibCuda(fail_at=call, code=code))
    step = run_check(str(vm_host(build_host)), tmp_path / "out", deps=deps).step("CUDA driver API")
    assert step.status == status, step


def test_nvidia_smi_is_run_with_the_driver_libraries_it_needs(build_host: BuildHost, tmp_path: Path) -> None:
    root = vm_host(build_host, **USR_LOCAL_NVIDIA)
    seen: dict[str, Any] = {}
    smi = FakeSmi(SMI_XML.read_text())
    original = smi.run

    def run(argv: Any, **kwargs: Any) -> Any:
        if list(argv[1:]) == ["-q", "-x"]:
            seen.update(argv=list(argv), env=kwargs.get("env") or {})
        return original(argv, **kwargs)

    smi.run = run  # type: ignore[method-assign]
    run_check(str(root), tmp_path / "out", deps=gpu_deps(smi=smi))
    assert seen["argv"][0] == str(root / "usr/local/nvidia/bin/nvidia-smi")
    assert seen["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(root / "usr/local/nvidia/lib64")


def test_writes_outside_the_status_directory_are_refused(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    fs = CheckFS(tmp_path / "root", "/run/gpu-check/validations", tmp_path / "status")
    fs.write_atomic("/run/gpu-check/validations/driver-ready", "X=1\n")
    assert (tmp_path / "status" / "driver-ready").read_text() == "X=1\n"
    for write in (
        lambda: fs.write_text("/etc/x", "y"),
        lambda: fs.symlink("/dev/char/1:2", "../x"),
        lambda: fs.remove("/run/gpu-check/other"),
    ):
        with pytest.raises(PermissionError):
            write()
    assert fs.refused_writes == ["/etc/x", "/dev/char/1:2", "/run/gpu-check/other"]
    assert list((tmp_path / "root").iterdir()) == []


def test_the_kernel_log_counts_xids_and_survives_what_it_cannot_parse(
    build_host: BuildHost, tmp_path: Path
) -> None:
    kmsg = (
        "6,100,5000,-;NVRM: Xid (PCI:0000:00:06): 79, pid=0, name=, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        "no header at all; ;;, \x7f\n"
        "4,101,5001,-;NVRM: Xid (PCI:0000:00:06): 13, pid=42, Graphics Exception\n"
        "4,102,5002,-;NVRM: Xid (PCI:0000:00:06): 13, pid=42, Graphics Exception\n"
        "9,x,y;NVRM: Xid (PCI:zzzz): notanumber\n"
        "6,103,5003,-;an unfinished last record"
    )
    root = vm_host(build_host, files={"/dev/kmsg": kmsg})
    step = run_check(str(root), tmp_path / "out").step("kernel log")
    assert step.status == OK
    assert step.details["source"] == "/dev/kmsg"
    assert step.details["xids"] == {"13": 2, "79": 1} and step.details["xid_lines"] == 3
    assert {f["code"] for f in step.details["findings"]} == {"xid-13", "xid-79"}


def test_a_nvidia_smi_found_only_on_path_names_no_driver_root(build_host: BuildHost, tmp_path: Path) -> None:
    root = vm_host(build_host, files={}, executables={})  # no driver files anywhere under the roots
    deps = gpu_deps()
    deps.which = lambda name: "/opt/driver/bin/nvidia-smi"
    report = run_check(str(root), tmp_path / "out", deps=deps)
    tools = report.step("nvidia tools").details
    assert tools["nvidia_smi"] == {"path": "/opt/driver/bin/nvidia-smi", "root": "PATH"}
    assert tools["driver_root"] is None
    assert report.step("nvidia-smi -q -x").status == OK
    assert rows(report)["driver root"]["verdict"] == NA_VERDICT


def test_a_guest_our_probe_takes_for_bare_metal_is_a_defect(build_host: BuildHost, tmp_path: Path) -> None:
    root = vm_host(build_host, files={"/proc/cpuinfo": "processor\t: 0\nflags\t\t: fpu vme\n"})
    report = run_check(str(root), tmp_path / "out", deps=gpu_deps())
    row = rows(report)["0000:00:06.0 virtualization"]
    assert (row["ours"], row["nvidia_smi"], row["verdict"]) == ("bare metal", "Pass-Through", MISMATCH)
    assert report.exit_code == EXIT_DEFECTS
