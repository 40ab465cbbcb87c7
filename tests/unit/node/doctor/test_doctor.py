"""Findings and the doctor report on every fixture, plus the conflicts users hit most."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.doctor.findings import Severity, diagnose, intended_workload
from gpu_operator.node.doctor.report import run
from gpu_operator.node.host.probe import probe
from tests.unit.node.nodekit import HOST_NAMES

# (fixture, declared workload) -> (error codes, warning codes)
EXPECTED = {
    ("cpu-only", None): (set(), set()),
    ("h100-vfio", None): (set(), set()),
    ("h100-vfio", "vm-passthrough"): (set(), set()),
    ("h100-nvidia-bound", "vm-passthrough"): ({"host-driver-on-passthrough", "gpu-not-on-vfio"}, set()),
    ("h100-nvidia-bound", None): (set(), {"nvidia-runtime-missing"}),
    # a vGPU host (the vGPU manager bound, no VF yet): nothing wrong for VMs with vGPUs; without a
    # label doctor infers vm-vgpu from the vGPU manager's module
    ("h100-vgpu", None): (set(), set()),
    ("h100-vgpu", "vm-vgpu"): (set(), set()),
    ("nouveau", None): ({"nouveau-loaded"}, {"no-driver"}),
    ("operator-driver", None): (set(), set()),
    ("talos", None): (set(), set()),
    ("ubuntu-apt-driver", None): (set(), set()),
    ("ubuntu-apt-driver", "vm-passthrough"): (
        {"host-driver-on-passthrough", "gpu-not-on-vfio"},
        {"vfio-pci-not-loaded"},
    ),
}


def test_every_fixture_is_diagnosed() -> None:
    assert {name for name, _ in EXPECTED} == set(HOST_NAMES)


@pytest.mark.parametrize(("name", "workload"), sorted(EXPECTED, key=str))
def test_findings_on_fixture(build_host, name: str, workload: str | None) -> None:  # type: ignore[no-untyped-def]
    findings = diagnose(probe(build_host(name).fs), workload)
    errors = {f.code for f in findings if f.severity == Severity.ERROR}
    warnings = {f.code for f in findings if f.severity == Severity.WARNING}
    assert (errors, warnings) == EXPECTED[(name, workload)]
    for f in findings:
        if f.severity != Severity.INFO:
            assert f.evidence and f.fix, f.code


def test_workload_is_inferred_from_host_signs(build_host) -> None:  # type: ignore[no-untyped-def]
    assert intended_workload(probe(build_host("h100-vfio").fs), None)[0] == "vm-passthrough"
    assert intended_workload(probe(build_host("talos").fs), None)[0] == "container"
    assert intended_workload(probe(build_host("h100-vgpu").fs), None)[0] == "vm-vgpu"
    modprobe = {"/etc/modprobe.d/vfio.conf": "options vfio-pci ids=10de:2330\nsoftdep nvidia pre: vfio-pci\n"}
    workload, why = intended_workload(probe(build_host("h100-nvidia-bound", files=modprobe).fs), None)
    assert workload == "vm-passthrough" and "options vfio-pci ids=10de:2330" in why
    with pytest.raises(ValueError, match="vm-passthrough"):
        intended_workload(probe(build_host("talos").fs), "vm")


def test_userspace_only_host_driver_on_passthrough_is_a_warning(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio", executables={"/usr/bin/nvidia-smi": "#!/bin/sh\n"})
    findings = {f.code: f for f in diagnose(probe(host.fs), "vm-passthrough")}
    assert findings["host-driver-on-passthrough"].severity == Severity.WARNING
    assert "gpu-not-on-vfio" not in findings


def test_passthrough_blockers(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host(
        "h100-nvidia-bound",
        iommu=False,
        pci_drivers=["nvme", "nvidia"],
        modules=["nvidia"],
        processes=[{"pid": 5, "comm": "nvidia-persistenced", "fds": ["/dev/nvidia0"]}],
    )
    codes = {f.code: f.severity for f in diagnose(probe(host.fs), "vm-passthrough")}
    assert codes["iommu-off"] == Severity.ERROR
    assert codes["vfio-pci-not-loaded"] == Severity.WARNING
    assert codes["gpu-in-use"] == Severity.WARNING


def test_cdi_enabled_without_specs_and_runtime_missing(build_host) -> None:  # type: ignore[no-untyped-def]
    config = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = true\n'
    host = build_host("ubuntu-apt-driver")
    host.fs.write_text("/etc/containerd/config.toml", config)
    found = {f.code: f for f in diagnose(probe(host.fs))}
    assert (
        found["cdi-enabled-no-specs"].severity == Severity.ERROR
    )  # a host toolkit is there: nobody else will
    assert found["nvidia-runtime-missing"].severity == Severity.ERROR
    assert (
        "nvidia-ctk runtime configure --runtime=containerd --config=/etc/containerd/config.toml"
        in found["nvidia-runtime-missing"].fix
    )
    assert "nvidia-ctk cdi generate" in found["cdi-enabled-no-specs"].fix


def test_driver_problems(build_host) -> None:  # type: ignore[no-untyped-def]
    no_module = build_host(
        "ubuntu-apt-driver",
        modules=[],
        pci_drivers=["snd_hda_intel"],
        devices=[{"address": "0000:41:00.0", "vendor": "10de", "device": "26b9", "class": "030200"}],
    )
    assert "driver-module-not-loaded" in {f.code for f in diagnose(probe(no_module.fs))}
    no_smi = build_host("ubuntu-apt-driver", executables={}, files={})
    assert "driver-userspace-missing" in {f.code for f in diagnose(probe(no_smi.fs))}
    twice = build_host("ubuntu-apt-driver")
    twice.fs.write_text("/run/nvidia/driver/usr/bin/nvidia-smi", "#!/bin/sh\n")
    twice.fs.resolve("/run/nvidia/driver/usr/bin/nvidia-smi").chmod(0o755)
    assert "driver-twice" in {f.code for f in diagnose(probe(twice.fs))}


def test_vfio_gpus_on_a_container_node_are_flagged(build_host) -> None:  # type: ignore[no-untyped-def]
    codes = {f.code for f in diagnose(probe(build_host("h100-vfio").fs), "container")}
    assert "gpu-on-vfio-in-container-mode" in codes


def test_report_rendering_and_exit_codes(build_host) -> None:  # type: ignore[no-untyped-def]
    console = Console(record=True, width=200)
    code = run(probe(build_host("h100-nvidia-bound").fs), "vm-passthrough", False, console)
    text = console.export_text()
    assert code == 1
    assert "ERROR    [host-driver-on-passthrough]" in text and "fix: Move the GPUs now" in text
    assert "2 error(s), 0 warning(s)" in text
    assert run(probe(build_host("talos").fs), None, False, Console(record=True)) == 0


def test_cli_doctor_json_and_exit_code(build_host) -> None:  # type: ignore[no-untyped-def]
    root = str(build_host("nouveau").fs.root)
    result = CliRunner().invoke(app, ["doctor", "--json", "--host-root", root])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["ok"] is False and data["findings"][0]["code"] == "nouveau-loaded"
    assert "blacklist nouveau" in data["findings"][0]["fix"]
    ok = CliRunner().invoke(app, ["doctor", "--host-root", str(build_host("operator-driver").fs.root)])
    assert ok.exit_code == 0 and "0 error(s)" in ok.output
    bad = CliRunner().invoke(app, ["doctor", "--workload-config", "vms", "--host-root", root])
    assert bad.exit_code == 2 and "--workload-config" in bad.output


def test_a_host_root_without_sysfs_is_an_error_not_a_cpu_only_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpu_operator.node.host.hostfs import HostFS

    (tmp_path / "etc").mkdir()
    findings = diagnose(probe(HostFS(tmp_path)))
    assert [(f.code, f.severity) for f in findings] == [("host-root-incomplete", Severity.ERROR)]


def test_crio_hook_mode_is_not_a_missing_runtime(build_host) -> None:  # type: ignore[no-untyped-def]
    """CRI-O under the toolkit's hook mode has no nvidia runtime, only NVIDIA's OCI hook in its hooks_dir:
    that gives containers their GPUs, so nothing is missing; without the hook the warning stays."""
    host = build_host("h100-nvidia-bound")
    host.fs.write_text("/etc/crio/crio.conf", "[crio.runtime]\n")
    # the kubelet names CRI-O's socket: the fixture's containerd config is not this node's runtime
    host.fs.write_text(
        "/var/lib/kubelet/config.yaml", "containerRuntimeEndpoint: unix:///var/run/crio/crio.sock\n"
    )
    assert "nvidia-runtime-missing" in {f.code for f in diagnose(probe(host.fs))}
    host.fs.write_text(
        "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json",
        '{"version": "1.0.0", "hook": {"path": "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"},'
        ' "stages": ["prestart"]}',
    )
    report = probe(host.fs)
    assert (report.runtime.name, report.runtime.nvidia_hook) == (
        "crio",
        "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json",
    )
    assert "nvidia-runtime-missing" not in {f.code for f in diagnose(report)}
