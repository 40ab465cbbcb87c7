"""The agent's calls to the vGPU manager's tools: nvidia-smi's MIG mode read and set, sriov-manage,
each run in the driver root it was given; answers read from their output fields."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gpu_operator.node.host.runner import CommandResult
from gpu_operator.node.vgpuhost.control import SRIOV_MANAGE, ToolControl, smi_bus_id
from tests.unit.node.conftest import BuildHost


class Runner:
    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.answers, self.calls = answers, []  # type: dict[str, CommandResult], list[tuple[tuple[str, ...], str | None]]

    def run(
        self,
        argv: Sequence[str],
        *,
        root: str | None = "/",
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        self.calls.append((tuple(argv), root))
        return self.answers.get(" ".join(argv), CommandResult(tuple(argv), 0, ""))


QUERY = "/usr/bin/nvidia-smi -i 00000000:41:00.0 --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader"


def test_mig_mode_is_read_from_the_two_fields() -> None:
    runner = Runner({QUERY: CommandResult((), 0, "Disabled, Enabled\n")})
    control = ToolControl(runner, "/run/nvidia/driver", "/usr/bin/nvidia-smi")
    assert control.mig_mode("0000:41:00.0") == (False, True)
    assert runner.calls[0][1] == "/run/nvidia/driver"


def test_a_gpu_without_mig_reads_as_none() -> None:
    control = ToolControl(Runner({QUERY: CommandResult((), 0, "[N/A], [N/A]\n")}), "/", "/usr/bin/nvidia-smi")
    assert control.mig_mode("0000:41:00.0") is None


def test_sriov_manage_and_mig_set_report_the_tools_error() -> None:
    runner = Runner(
        {f"{SRIOV_MANAGE} -e 0000:41:00.0": CommandResult((SRIOV_MANAGE,), 1, "", "Cannot obtain unbindLock")}
    )
    control = ToolControl(runner, "/", "/usr/bin/nvidia-smi")
    assert control.enable_vfs("0000:41:00.0") == f"`{SRIOV_MANAGE}` exited 1: Cannot obtain unbindLock"
    assert control.set_mig_mode("0000:41:00.0", True) is None
    assert runner.calls[-1][0] == ("/usr/bin/nvidia-smi", "-i", "00000000:41:00.0", "-mig", "1")


def test_bus_ids_take_nvidia_smis_form() -> None:
    assert smi_bus_id("0000:c1:00.0") == "00000000:C1:00.0"


def test_the_command_runs_the_hosts_tools_and_exits_1_when_a_step_fails(
    build_host: BuildHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The whole command on the fixture host, with its own nvidia-smi and an sriov-manage that fails
    (as the fixture's does): the pass reports the VF step with the tool's error and exits 1."""
    from typer.testing import CliRunner

    from gpu_operator.cli import app
    from tests.unit.node.vgpuhost.test_vgpuhost import CONFIG

    smi = '#!/bin/sh\ncase "$*" in *--query-gpu=mig.mode*) echo "Disabled, Disabled";; esac\n'
    host = build_host(
        "h100-vgpu", executables={**build_host("h100-vgpu").spec["executables"], "/usr/bin/nvidia-smi": smi}
    )
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    monkeypatch.setenv("GPU_OPERATOR_NO_CHROOT", "1")
    result = CliRunner().invoke(
        app,
        [
            "node",
            "vgpu-host-state",
            "--no-node",
            "--host-root",
            str(host.fs.root),
            "--config-file",
            str(config),
            "--default-config",
            "H100XM-20C",
            "--default-workload",
            "vm-vgpu",
            "--fabric-mode",
            "2",
            "--wait-driver",
            "0",
        ],
    )
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert "0000:41:00.0 mig-mode: ok: MIG off" in lines
    assert (
        "0000:41:00.0 vfs: failed: sriov-manage -e: `/usr/lib/nvidia/sriov-manage -e 0000:41:00.0` exited 1: "
        "sriov-manage is played by the tests' vGPU host simulator" in lines
    )
    assert lines[-1] == "vGPU host state: failed"
    record = json.loads(host.fs.read_text("/var/lib/gpu-operator/vgpu-host-state.json") or "{}")
    assert record["desired"]["config"] == "H100XM-20C"
    assert [g["vf_types"] for g in record["desired"]["gpus"]] == [["H100XM-20C"] * 4] * 2
    assert [g["vfs"] for g in record["desired"]["gpus"]] == [16, 16]


def test_the_command_leaves_a_node_of_another_workload_at_once(build_host) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from gpu_operator.cli import app

    host = build_host("h100-vgpu")
    result = CliRunner().invoke(
        app,
        [
            "node",
            "vgpu-host-state",
            "--no-node",
            "--host-root",
            str(host.fs.root),
            "--default-workload",
            "vm-passthrough",
        ],
    )
    assert (
        result.exit_code == 0
        and result.output == "workload config is vm-passthrough: no vGPU host state to keep\n"
    )
