"""Validator components on fixture hosts: status files and formats, bounded waits with reasons, skips."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.node.host.driver import detect_driver
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.validate.base import Outcome
from gpu_operator.node.validate.config import COMPONENTS, ValidatorConfig, ValidatorConfigError
from gpu_operator.node.validate.run import validate
from tests.support.hostsim import fakehost
from tests.unit.node.nodekit import HOST_NAMES, HOSTS_DIR, FakeNodeView, context

VALIDATIONS = "/run/nvidia/validations"
FAILING_SMI = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2\nexit 9\n"


def _read(fs: HostFS, name: str) -> str | None:
    return fs.read_text(f"{VALIDATIONS}/{name}")


@pytest.mark.parametrize(
    ("name", "root", "ctr_path"),
    [
        ("ubuntu-apt-driver", "/", "/host"),
        # Talos' extension: nvidia-smi in /usr/local/bin, the libraries under /usr/local/glibc; the
        # components mount the host root at /host, so they see that tree at /host/usr/local
        ("talos", "/usr/local", "/host/usr/local"),
    ],
)
def test_host_driver_passes_and_writes_driver_ready(build_host, name: str, root: str, ctr_path: str) -> None:  # type: ignore[no-untyped-def]
    host = build_host(name)
    ctx, _ = context(host.fs)
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.PASSED, result.message
    assert _read(host.fs, "driver-ready") == (
        f"IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT={root}\nDRIVER_ROOT_CTR_PATH={ctr_path}\nNVIDIA_DEV_ROOT=/\n"
        "DEV_ROOT_CTR_PATH=/host\n"
    )


def test_driver_validation_that_cannot_make_the_dev_char_links_fails_with_the_fix(  # type: ignore[no-untyped-def]
    build_host, tmp_path, monkeypatch
) -> None:
    """A /host-dev-char the validator cannot write (here: a directory where a link must go)."""
    from gpu_operator.node.validate import host as host_mod

    mounted = tmp_path / "host-dev-char"
    (mounted / "195:255").mkdir(parents=True)  # no link can replace a directory
    monkeypatch.setattr(host_mod, "DEV_CHAR_MOUNT", mounted)
    ctx, _ = context(build_host("ubuntu-apt-driver").fs)
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.FAILED
    assert (
        "cannot create the /dev/char links" in result.message
        and "DISABLE_DEV_CHAR_SYMLINK_CREATION=true" in result.message
    )


def test_operator_driver_passes_and_points_at_the_driver_root(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver")
    ctx, _ = context(host.fs)
    assert validate(ctx, "driver").outcome == Outcome.PASSED
    values = dict(line.split("=", 1) for line in (_read(host.fs, "driver-ready") or "").splitlines())
    assert values["IS_HOST_DRIVER"] == "false"
    assert (
        values["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
        and values["DRIVER_ROOT_CTR_PATH"] == "/driver-root"
    )


@pytest.mark.parametrize(
    ("name", "root"), [("ubuntu-apt-driver", "/hosts/a"), ("talos", "/hosts/a/usr/local")]
)
def test_a_custom_host_root_prefixes_a_host_drivers_root(build_host, name: str, root: str) -> None:  # type: ignore[no-untyped-def]
    """hostPaths.rootFS reaches the validator as HOST_ROOT: the host paths it writes are under it
    (as NVIDIA's getDriverInfo does); the containers still see that root at /host."""
    host = build_host(name)
    ctx, _ = context(host.fs, {"HOST_ROOT": "/hosts/a"})
    assert validate(ctx, "driver").outcome == Outcome.PASSED
    values = dict(line.split("=", 1) for line in (_read(host.fs, "driver-ready") or "").splitlines())
    assert (values["NVIDIA_DRIVER_ROOT"], values["NVIDIA_DEV_ROOT"], values["DEV_ROOT_CTR_PATH"]) == (
        root,
        "/hosts/a",
        "/host",
    )
    assert values["DRIVER_ROOT_CTR_PATH"] == "/host" + root.removeprefix("/hosts/a")


def test_a_custom_driver_install_dir_is_the_driver_root_written(build_host) -> None:  # type: ignore[no-untyped-def]
    """hostPaths.driverInstallDir reaches the validator as DRIVER_INSTALL_DIR: the operator's driver
    found there is the root every component reads; they mount that dir at /driver-root."""
    spec = fakehost.load_spec(HOSTS_DIR / "operator-driver.yaml")
    moved = {
        key: {
            path.replace("/run/nvidia/driver/", "/opt/nvidia/driver/"): text
            for path, text in spec[key].items()
        }
        for key in ("files", "executables")
    }
    host = build_host("operator-driver", **moved)
    ctx, _ = context(host.fs, {"DRIVER_INSTALL_DIR": "/opt/nvidia/driver"})
    assert validate(ctx, "driver").outcome == Outcome.PASSED
    values = dict(line.split("=", 1) for line in (_read(host.fs, "driver-ready") or "").splitlines())
    assert (values["IS_HOST_DRIVER"], values["NVIDIA_DRIVER_ROOT"], values["DRIVER_ROOT_CTR_PATH"]) == (
        "false",
        "/opt/nvidia/driver",
        "/driver-root",
    )


def test_operator_driver_wait_is_bounded_and_names_what_it_waited_for(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("nouveau")
    ctx, clock = context(
        host.fs, {"WITH_WAIT": "true", "DRIVER_TIMEOUT_SECONDS": "60", "SLEEP_INTERVAL_SECONDS": "5"}
    )
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.FAILED
    assert "waited 60s of 60s" in result.message and ".driver-ctr-ready" in result.message
    assert "nvidia-driver-daemonset" in result.message
    assert clock.now == 60 and len(clock.sleeps) == 12
    assert _read(host.fs, "driver-ready") is None


def test_failing_nvidia_smi_is_reported_with_its_output(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    host.fs.write_text("/usr/bin/nvidia-smi", FAILING_SMI)
    ctx, clock = context(host.fs)
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.FAILED and clock.sleeps == []  # WITH_WAIT=false: one try
    assert "exited 9: NVIDIA-SMI has failed" in result.message and "checked once" in result.message


def test_skip_gpu_init_uses_version_only(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    host.fs.write_text("/usr/bin/nvidia-smi", '#!/bin/sh\n[ "$1" = "--version" ] && exit 0\nexit 9\n')
    ctx, _ = context(host.fs, {"DRIVER_VALIDATION_SKIP_GPU_INIT": "true"})
    assert validate(ctx, "driver").outcome == Outcome.PASSED


def test_driver_on_an_all_vfio_node_fails_fast_with_the_fix(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    ctx, clock = context(host.fs, {"WITH_WAIT": "true"})
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.FAILED and clock.sleeps == []
    assert "vfio-pci" in result.message and "nvidia.com/gpu.workload.config=vm-passthrough" in result.message


def test_operator_driver_extra_modules_from_driver_ctr_ready(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver")
    host.fs.write_text(f"{VALIDATIONS}/.driver-ctr-ready", "GDS_ENABLED=true\nGDRCOPY_ENABLED=false\n")
    ctx, _ = context(host.fs)
    result = validate(ctx, "driver")
    assert result.outcome == Outcome.FAILED and "nvidia_fs" in result.message
    host.fs.write_text(
        "/proc/modules", (host.fs.read_text("/proc/modules") or "") + "nvidia_fs 1 0 - Live 0x0\n"
    )
    assert validate(ctx, "driver").outcome == Outcome.PASSED


@pytest.mark.parametrize(
    ("component", "module"),
    [("nvidia-fs", "nvidia_fs"), ("gdrcopy", "gdrdrv"), ("nvidia-peermem", "nvidia_peermem")],
)
def test_module_components(build_host, component: str, module: str) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver")
    ctx, _ = context(host.fs)
    assert validate(ctx, component).outcome == Outcome.FAILED
    host.fs.write_text("/proc/modules", f"{module} 1 0 - Live 0x0\n")
    result = validate(ctx, component)
    assert result.outcome == Outcome.PASSED and _read(host.fs, f"{component}-ready") == ""


def test_vfio_pci_on_the_seed_host_and_on_a_host_driver_node(build_host) -> None:  # type: ignore[no-untyped-def]
    good = build_host("h100-vfio")
    ctx, _ = context(good.fs, kube=FakeNodeView(labels={"nvidia.com/gpu.workload.config": "vm-passthrough"}))
    assert validate(ctx, "vfio-pci").outcome == Outcome.PASSED
    assert _read(good.fs, "workload-type") == "vm-passthrough" and _read(good.fs, "vfio-pci-ready") == ""
    bad = build_host("h100-nvidia-bound")
    ctx, _ = context(bad.fs, {"WITH_WAIT": "true", "VFIO_PCI_TIMEOUT_SECONDS": "10"})
    result = validate(ctx, "vfio-pci")  # DEFAULT_GPU_WORKLOAD_CONFIG is vm-passthrough
    assert result.outcome == Outcome.FAILED
    assert "0000:0a:00.0 -> nvidia" in result.message and "an NVIDIA host driver is present" in result.message
    assert _read(bad.fs, "vfio-pci-ready") is None and _read(bad.fs, "workload-type") == "vm-passthrough"


def test_vfio_pci_not_applicable_on_container_nodes(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("ubuntu-apt-driver")
    ctx, _ = context(host.fs, kube=FakeNodeView(labels={"nvidia.com/gpu.workload.config": "container"}))
    result = validate(ctx, "vfio-pci")
    assert result.outcome == Outcome.NOT_APPLICABLE and _read(host.fs, "workload-type") == "container"


def test_vgpu_components(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver")
    ctx, _ = context(host.fs, {"GPU_WORKLOAD_CONFIG": "vm-vgpu", "VGPU_MANAGER_TIMEOUT_SECONDS": "20"})
    result = validate(ctx, "vgpu-manager")
    assert result.outcome == Outcome.FAILED and "mdev" in result.message
    host.fs.mkdir("/sys/class/mdev_bus/0000:07:00.0")
    assert validate(ctx, "vgpu-manager").outcome == Outcome.PASSED
    assert _read(host.fs, "vgpu-manager-ready") == ""
    assert validate(ctx, "vgpu-devices").outcome == Outcome.FAILED
    host.fs.mkdir("/sys/bus/mdev/devices/2c1c0e3e-0000-4e2b-9d6c-000000000001")
    assert validate(ctx, "vgpu-devices").outcome == Outcome.PASSED


def test_cc_manager(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("h100-vfio")
    ctx, _ = context(host.fs, kube=FakeNodeView())
    assert validate(ctx, "cc-manager").outcome == Outcome.NOT_APPLICABLE
    ctx, _ = context(host.fs, {"CC_CAPABLE": "true"})
    assert validate(ctx, "cc-manager").outcome == Outcome.FAILED
    host.fs.write_text(f"{VALIDATIONS}/.cc-manager-ctr-ready", "")
    assert validate(ctx, "cc-manager").outcome == Outcome.PASSED


def test_mofed_only_with_rdma_and_a_mellanox_device(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("operator-driver")
    ctx, _ = context(host.fs, {"GPU_DIRECT_RDMA_ENABLED": "true"})
    assert validate(ctx, "mofed").outcome == Outcome.NOT_APPLICABLE
    nic = {
        "address": "0000:31:00.0",
        "vendor": "15b3",
        "device": "101b",
        "class": "020700",
        "driver": "mlx5_core",
    }
    rdma = build_host("operator-driver", devices=[nic])
    ctx, _ = context(rdma.fs, {"GPU_DIRECT_RDMA_ENABLED": "true"})
    assert validate(ctx, "mofed").outcome == Outcome.PASSED and _read(rdma.fs, "mofed-ready") == ""


def test_toolkit_runs_nvidia_smi_in_this_container(build_host, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    ctx, _ = context(host.fs)
    result = validate(ctx, "toolkit")
    assert (
        result.outcome == Outcome.FAILED
        and "nvidia-smi" in result.message
        and "container-toolkit" in result.message
    )
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    assert validate(ctx, "toolkit").outcome == Outcome.PASSED and _read(host.fs, "toolkit-ready") == ""


def test_skipped_components_still_unblock_their_dependents(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("cpu-only")
    ctx, _ = context(host.fs, {"VALIDATOR_SKIP": "cuda, toolkit", "DISABLE_DRIVER_VALIDATION": "true"})
    for component in ("cuda", "toolkit", "driver"):
        assert validate(ctx, component).outcome == Outcome.SKIPPED
    assert _read(host.fs, "cuda-ready") == "VALIDATION_SKIPPED=true\n"
    assert "IS_HOST_DRIVER=false" in (_read(host.fs, "driver-ready") or "")


def test_status_file_is_deleted_before_a_failing_check(build_host) -> None:  # type: ignore[no-untyped-def]
    host = build_host("nouveau")
    host.fs.write_text(f"{VALIDATIONS}/driver-ready", "IS_HOST_DRIVER=true\n")
    ctx, _ = context(host.fs)
    assert validate(ctx, "driver").outcome == Outcome.FAILED
    assert _read(host.fs, "driver-ready") is None


def test_config_errors_name_the_variable() -> None:
    with pytest.raises(ValidatorConfigError, match="VALIDATOR_SKIP.*bogus"):
        ValidatorConfig.from_env({"VALIDATOR_SKIP": "bogus"})
    with pytest.raises(ValidatorConfigError, match="WITH_WAIT"):
        ValidatorConfig.from_env({"WITH_WAIT": "maybe"})
    with pytest.raises(ValidatorConfigError, match="GPU_WORKLOAD_CONFIG"):
        ValidatorConfig.from_env({"GPU_WORKLOAD_CONFIG": "vm"})
    config = ValidatorConfig.from_env({"VALIDATION_TIMEOUT_SECONDS": "7", "CUDA_TIMEOUT_SECONDS": "9"})
    assert config.budgets["driver"] == 7 and config.budgets["cuda"] == 9
    assert set(ValidatorConfig.from_env({}).budgets) == set(COMPONENTS)


def test_cli_validate_writes_status_and_reports_failures(build_host, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPU_OPERATOR_NO_CHROOT", "1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))
    host = build_host("talos")
    ok = CliRunner().invoke(app, ["validate", "-c", "driver", "--host-root", str(host.fs.root)])
    assert ok.exit_code == 0 and "driver: passed" in ok.output
    bad = build_host("nouveau")
    failed = CliRunner().invoke(app, ["validate", "--component", "driver", "--host-root", str(bad.fs.root)])
    assert failed.exit_code == 1 and ".driver-ctr-ready" in failed.output
    assert ".driver-ctr-ready" in (tmp_path / "termination-log").read_text()
    unknown = CliRunner().invoke(app, ["validate", "-c", "gpu", "--host-root", str(bad.fs.root)])
    assert unknown.exit_code == 2 and "nvidia-peermem" in unknown.output


def test_dev_char_symlinks_for_nvidia_character_devices(build_host) -> None:  # type: ignore[no-untyped-def]
    import os
    import stat as stat_mod
    from pathlib import Path
    from types import SimpleNamespace

    from gpu_operator.node.validate.host import create_dev_char_symlinks
    from gpu_operator.sim.hardware import devnodes

    host = build_host("ubuntu-apt-driver")  # its loaded driver made /dev/nvidia0, nvidiactl, nvidia-uvm...
    host.fs.write_text("/dev/null", "")  # not NVIDIA's: never linked

    def stat_fn(path):  # type: ignore[no-untyped-def]
        """os.stat; a device-node stand-in (the tree's, where mknod was refused) reads as its device."""
        ids = devnodes.char_device(Path(path))
        if ids is None or stat_mod.S_ISCHR(os.stat(path).st_mode):
            return os.stat(path)
        return SimpleNamespace(st_mode=stat_mod.S_IFCHR, st_rdev=os.makedev(*ids))

    made = create_dev_char_symlinks(host.fs, stat_fn)
    expected = {
        f"/dev/char/{major}:{minor}": f"../{path.rsplit('/', 1)[1]}"
        for path, (major, minor) in devnodes.driver_nodes(
            {"nvidia", "nvidia_uvm", "nvidia_modeset"}, [0, 1]
        ).items()
    }  # two GPUs
    assert sorted(made) == sorted(expected) and "/dev/char/195:255" in expected
    assert all(host.fs.readlink(link) == target for link, target in expected.items())
    assert create_dev_char_symlinks(host.fs, stat_fn) == []  # idempotent


def test_dev_char_symlinks_go_into_the_pods_dev_char_mount_not_the_read_only_host_root(  # type: ignore[no-untyped-def]
    build_host, tmp_path
) -> None:
    """In the validator pod /host is read-only; the host's /dev/char is mounted at /host-dev-char."""
    import os

    from gpu_operator.node.validate.host import create_dev_char_symlinks

    host = build_host("ubuntu-apt-driver")
    mounted = tmp_path / "host-dev-char"
    mounted.mkdir()
    made = create_dev_char_symlinks(host.fs, link_dir=mounted)
    assert "/dev/char/195:255" in made and os.readlink(mounted / "195:255") == "../nvidiactl"
    assert not host.fs.exists("/dev/char")  # nothing written through the host root
    assert create_dev_char_symlinks(host.fs, link_dir=mounted) == []  # idempotent


# fixture -> (driver outcome, words its message must hold; vfio-pci outcome on a vm-passthrough node)
EVERY_FIXTURE = {
    "cpu-only": (Outcome.FAILED, "no NVIDIA GPU", Outcome.FAILED),
    "h100-nvidia-bound": (Outcome.PASSED, "host (distribution)", Outcome.FAILED),
    "h100-vfio": (Outcome.FAILED, "vfio-pci", Outcome.PASSED),
    # the vGPU manager's module is loaded, its nvidia-smi not in the fixture: the container driver check fails
    "h100-vgpu": (Outcome.FAILED, "nvidia-smi is in none of", Outcome.FAILED),
    "nouveau": (Outcome.FAILED, ".driver-ctr-ready", Outcome.FAILED),
    "operator-driver": (Outcome.PASSED, "operator", Outcome.FAILED),
    "talos": (Outcome.PASSED, "host (talos)", Outcome.FAILED),
    "ubuntu-apt-driver": (Outcome.PASSED, "host (distribution)", Outcome.FAILED),
}


@pytest.mark.parametrize("name", HOST_NAMES)
def test_driver_and_vfio_pci_on_every_fixture(build_host, name: str) -> None:  # type: ignore[no-untyped-def]
    driver_outcome, words, vfio_outcome = EVERY_FIXTURE[name]
    host = build_host(name)
    ctx, _ = context(host.fs)
    result = validate(ctx, "driver")
    assert (result.outcome, words in result.message) == (driver_outcome, True), result.message
    assert validate(ctx, "vfio-pci").outcome == vfio_outcome


def test_nvidia_validator_entry_takes_upstreams_env_contract(build_host, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpu_operator.node.validator_cli import app as validator_app

    monkeypatch.setenv("GPU_OPERATOR_NO_CHROOT", "1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))
    host = build_host("talos")
    env = {"COMPONENT": "driver", "WITH_WAIT": "false", "GPU_OPERATOR_HOST_ROOT": str(host.fs.root)}
    ok = CliRunner().invoke(validator_app, [], env=env)
    assert ok.exit_code == 0 and "driver: passed" in ok.output
    assert _read(host.fs, "driver-ready") is not None
    # a flag overrides its env variable, as upstream's do
    out = tmp_path / "elsewhere"
    moved = CliRunner().invoke(validator_app, ["-c", "driver", "-o", "/run/elsewhere"], env=env)
    assert moved.exit_code == 0 and host.fs.exists("/run/elsewhere/driver-ready") and not out.exists()
    bad = CliRunner().invoke(validator_app, [], env={**env, "WITH_WAIT": "maybe"})
    assert bad.exit_code == 2 and "WITH_WAIT='maybe'" in bad.output


def test_component_metrics_serves_the_node_status_exporter(build_host, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from gpu_operator.node import cli as node_cli

    served: list[tuple[int, str]] = []
    monkeypatch.setattr(
        node_cli, "serve_metrics", lambda root, config, port, address: served.append((port, address))
    )
    host = build_host("talos")
    result = CliRunner().invoke(
        app,
        ["validate", "--host-root", str(host.fs.root)],
        env={"COMPONENT": "metrics", "METRICS_PORT": "8123"},
    )
    assert result.exit_code == 0, result.output
    assert served == [(8123, "0.0.0.0")]


BUNDLE_SMI = """#!/bin/sh
# as NVIDIA's: it answers only when the loader finds libnvidia-ml, which is in no ld cache here
case "$LD_LIBRARY_PATH" in
  */usr/local/nvidia/lib64*) echo "NVIDIA-SMI 580.159.04    Driver Version: 580.159.04"; exit 0 ;;
esac
echo "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system."
exit 12
"""


def test_a_driver_mounted_at_usr_local_nvidia_is_the_root_and_its_nvidia_smi_answers(  # type: ignore[no-untyped-def]
    build_host, monkeypatch, tmp_path
) -> None:
    """The layout of GKE's driver installer inside containers, and of a VM given a GPU with the driver
    mounted read-only: bin/ and lib64/ under /usr/local/nvidia, nothing in the system's dirs."""
    monkeypatch.setenv("GPU_OPERATOR_NO_CHROOT", "1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))
    host = build_host(
        "ubuntu-apt-driver",
        executables={"/usr/local/nvidia/bin/nvidia-smi": BUNDLE_SMI},
        files={"/usr/local/nvidia/lib64/libnvidia-ml.so.1": "", "/usr/local/nvidia/lib64/libcuda.so.1": ""},
    )
    info = detect_driver(host.fs)
    assert (info.source, info.driver_root, info.nvidia_smi) == (
        "host",
        "/usr/local/nvidia",
        "/usr/local/nvidia/bin/nvidia-smi",
    )
    assert info.smi_env == {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    ok = CliRunner().invoke(app, ["validate", "-c", "driver", "--host-root", str(host.fs.root)])
    assert ok.exit_code == 0 and "driver: passed" in ok.output, ok.output
