"""The agent's calls to the vGPU manager's tools: nvidia-smi's MIG mode read and set, sriov-manage,
each run in the driver root it was given; answers read from their output fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_operator.node.runner import CommandResult
from gpu_operator.node.vgpuhost.control import SRIOV_MANAGE, ToolControl, smi_bus_id


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
