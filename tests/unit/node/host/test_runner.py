"""HostRunner: chroot into the host root by default, direct execution of host-root binaries otherwise."""

from __future__ import annotations

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runner import CommandResult, HostRunner


def test_chroot_mode_builds_a_chroot_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fs = HostFS(tmp_path)
    (tmp_path / "run" / "nvidia" / "driver").mkdir(parents=True)
    runner = HostRunner(fs, chroot=True)
    assert runner._argv(["nvidia-smi"], "/") == ["chroot", str(tmp_path), "nvidia-smi"]
    assert runner._argv(["nvidia-smi"], "/run/nvidia/driver") == [
        "chroot",
        str(tmp_path / "run/nvidia/driver"),
        "nvidia-smi",
    ]
    assert runner._argv(["nvidia-smi", "-L"], None) == ["nvidia-smi", "-L"]


def test_direct_mode_runs_the_host_roots_binary(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fs = HostFS(tmp_path)
    fs.write_text("/usr/bin/nvidia-smi", '#!/bin/sh\necho "args: $*"\n')
    fs.resolve("/usr/bin/nvidia-smi").chmod(0o755)
    result = HostRunner(fs, chroot=False).run(["nvidia-smi", "-L"], root="/")
    assert result.ok and result.stdout == "args: -L\n"


def test_missing_binary_escape_and_timeout_are_results_not_crashes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fs = HostFS(tmp_path)
    runner = HostRunner(fs, chroot=False)
    missing = runner.run(["/usr/bin/nvidia-smi"], root="/")
    assert missing.returncode == 127 and "nvidia-smi" in missing.summary()
    assert runner.run(["/../../bin/sh"], root="/").returncode == 126
    fs.write_text("/usr/bin/slow", "#!/bin/sh\nsleep 5\n")
    fs.resolve("/usr/bin/slow").chmod(0o755)
    slow = runner.run(["slow"], root="/", timeout=0.2)
    assert slow.timed_out and not slow.ok and "did not finish" in slow.summary()


def test_summary_uses_the_last_line_of_stderr() -> None:
    result = CommandResult(("nvidia-smi",), 9, "", "first\nNVIDIA-SMI has failed\n")
    assert result.summary() == "`nvidia-smi` exited 9: NVIDIA-SMI has failed"
