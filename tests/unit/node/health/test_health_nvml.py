"""NVML as NVIDIA documents it (tests/unit/node/health/nvml_standin.py): a lost GPU answers every call with
NVML_ERROR_GPU_IS_LOST and is never healthy; what cannot be tied to one GPU marks every GPU it could
be; gpu-check's NVML step lists the others and names the lost bus; and the driver's recovery action
(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) chooses the action ahead of the Xid catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_operator.api.health import HealthReport
from gpu_operator.node.gpucheck.check import run_check
from gpu_operator.node.gpucheck.steps import OK
from gpu_operator.node.health import HealthAgent, encode
from gpu_operator.node.health.nvml import RECOVERY_ACTIONS, RECOVERY_FIELD, NvmlSource, handle_key
from gpu_operator.node.host.hostfs import HostFS
from tests.unit.node.gpucheck_fakes import gpu_deps
from tests.unit.node.health.nvml_standin import DBE_EVENT, XID_EVENT, NvmlStandin
from tests.unit.node.health.test_health import GPUS, validated

# nvidia-ml-py's NVML_GPU_RECOVERY_ACTION_* numbers
NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET = 0, 1, 2, 3, 4


@pytest.fixture
def host(build_host: Any) -> HostFS:
    fs: HostFS = build_host("h100-nvidia-bound").fs
    fs.write_text("/dev/kmsg", "6,1,0,-;Linux version 6.8.0-generic\n")
    validated(fs)
    return fs


def agent_for(fs: HostFS, nvml: NvmlStandin) -> HealthAgent:
    logs: list[str] = []
    agent = HealthAgent(fs, "node-a", nvml=True, nvml_module=nvml, log=logs.append)
    agent.logs = logs  # type: ignore[attr-defined]
    return agent


def listed(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    HealthReport.parse(encode(report))  # every report stays one the operator reads
    return {g["bus"]: g for g in report["gpus"]}


def test_the_standin_answers_gpu_is_lost_to_every_call_on_a_lost_gpu() -> None:
    nvml = NvmlStandin(GPUS)
    handle = nvml.nvmlDeviceGetHandleByIndex(2)
    nvml.lost.add(2)
    for call in (
        nvml.nvmlDeviceGetPciInfo,
        nvml.nvmlDeviceGetIndex,
        nvml.nvmlDeviceGetUUID,
        lambda h: nvml.nvmlDeviceGetTemperature(h, 0),
        lambda h: nvml.nvmlDeviceGetFieldValues(h, [230]),
    ):
        with pytest.raises(NvmlStandin.NVMLError) as err:
            call(handle)
        assert err.value.value == nvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(NvmlStandin.NVMLError):
        nvml.nvmlDeviceGetHandleByIndex(2)


def test_a_gpu_lost_before_the_agent_starts_is_gone_from_the_first_poll(host: HostFS) -> None:
    nvml = NvmlStandin(GPUS)
    nvml.lost.add(2)
    agent = agent_for(host, nvml)
    gpus = listed(agent.observe())
    assert list(gpus) == ["0000:3b:00.0"]  # the one GPU of the node NVML could not name
    assert (gpus["0000:3b:00.0"]["state"], gpus["0000:3b:00.0"]["action"], gpus["0000:3b:00.0"]["index"]) == (
        "gone",
        "reboot",
        2,
    )
    assert any("GPU 2 does not answer" in line for line in agent.logs)  # type: ignore[attr-defined]


def test_a_gpu_lost_when_nvml_starts_again_is_gone_at_once(host: HostFS) -> None:
    """The agent lets NVML go for a reset and starts it again (agent.act): a GPU lost meanwhile is
    one NVML cannot name any more, and still gone."""
    nvml = NvmlStandin(GPUS)
    agent = agent_for(host, nvml)
    assert listed(agent.observe()) == {}
    assert agent.nvml is not None
    agent.nvml.close()
    nvml.lost.add(7)
    agent.nvml = NvmlSource(lambda _: None, nvml)
    gpus = listed(agent.observe())
    assert {b: (g["state"], g.get("index")) for b, g in gpus.items()} == {"0000:c1:00.0": ("gone", 7)}


def test_two_lost_gpus_mark_every_gpu_they_could_be(host: HostFS) -> None:
    nvml = NvmlStandin(GPUS)
    nvml.lost |= {2, 5}
    gpus = listed(agent_for(host, nvml).observe())
    assert set(gpus) == {"0000:3b:00.0", "0000:90:00.0"}
    assert all(g["state"] == "gone" and "index" not in g for g in gpus.values())


def test_a_gpu_lost_after_start_is_gone_whatever_it_answers(host: HostFS) -> None:
    nvml = NvmlStandin(GPUS)
    agent = agent_for(host, nvml)
    assert listed(agent.observe()) == {}
    nvml.lost.add(4)
    nvml.queue.append((4, XID_EVENT, 79))  # identified by its handle: no call answers for it any more
    gpus = listed(agent.observe())
    assert list(gpus) == ["0000:87:00.0"] and (
        gpus["0000:87:00.0"]["state"],
        gpus["0000:87:00.0"]["xid"],
    ) == ("gone", 79)


def test_an_xid_79_event_of_a_device_nvml_cannot_name_marks_every_gpu_it_could_be(host: HostFS) -> None:
    nvml = NvmlStandin(GPUS)
    nvml.lost |= {2, 6}  # not identified at start: their handles are unknown to the agent
    agent = agent_for(host, nvml)
    nvml.queue.append((6, XID_EVENT, 79))
    gpus = listed(agent.observe())
    assert {b: g.get("xid") for b, g in gpus.items()} == {"0000:3b:00.0": 79, "0000:b8:00.0": 79}
    logs: list[str] = agent.logs  # type: ignore[attr-defined]
    assert any("can no longer name" in line and "0000:3b:00.0, 0000:b8:00.0" in line for line in logs)


def test_gpu_check_lists_the_answering_gpus_and_names_the_lost_bus(build_host: Any, tmp_path: Path) -> None:
    nvml = NvmlStandin(GPUS)
    nvml.lost.add(2)
    root = build_host("h100-nvidia-bound").fs.root
    step = run_check(str(root), tmp_path / "out", deps=gpu_deps(nvml=nvml)).step("NVML")
    assert step.status == OK, step.summary
    assert [g["bus"] for g in step.details["gpus"]] == [g for g in GPUS if g != "0000:3b:00.0"]
    assert step.details["lost"] == ["0000:3b:00.0"] and list(step.details["unanswered"]) == [2]
    assert "0000:3b:00.0" in step.summary


@pytest.mark.parametrize(
    ("value", "word", "action"),
    [
        (GPU_RESET, "gpu-reset", "reset-gpu"),
        (NODE_REBOOT, "node-reboot", "reboot"),
        (DRAIN_P2P, "drain-p2p", "reset-gpu"),
        (DRAIN_AND_RESET, "drain-and-reset", "reset-gpu"),
        (5, "recover-imex-domain", "none"),
        (6, "bus-reset", "reboot"),
        (7, "system-reboot", "reboot"),
    ],
)
def test_the_recovery_action_alone_makes_a_gpu_unhealthy_with_its_action(
    host: HostFS, value: int, word: str, action: str
) -> None:
    nvml = NvmlStandin(GPUS)
    nvml.recovery[3] = value
    gpus = listed(agent_for(host, nvml).observe())
    assert {b: (g["state"], g["action"], g["recovery"]) for b, g in gpus.items()} == {
        "0000:44:00.0": ("unhealthy", action, word)
    }


def test_the_recovery_action_comes_ahead_of_the_catalogue_and_its_return_to_none_releases(
    host: HostFS,
) -> None:
    nvml = NvmlStandin(GPUS)
    agent = agent_for(host, nvml)
    nvml.recovery[3] = GPU_RESET
    nvml.queue.append((3, DBE_EVENT, 0))  # Xid 48: the catalogue says reset-gpu too
    nvml.recovery[1] = NODE_REBOOT
    nvml.queue.append((1, XID_EVENT, 13))  # the catalogue: restart-app; the driver: reboot the node
    gpus = listed(agent.observe())
    assert (gpus["0000:44:00.0"]["action"], gpus["0000:44:00.0"]["xid"]) == ("reset-gpu", 48)
    assert (gpus["0000:18:00.0"]["state"], gpus["0000:18:00.0"]["action"]) == ("unhealthy", "reboot")
    nvml.recovery[3] = nvml.recovery[1] = NONE  # the driver no longer asks for anything
    gpus = listed(agent.observe())
    assert (
        gpus["0000:44:00.0"]["state"],
        gpus["0000:44:00.0"]["action"],
        gpus["0000:44:00.0"]["recovery"],
    ) == ("warning", "restart-app", "none")
    assert gpus["0000:18:00.0"]["state"] == "warning"


def test_a_milder_recovery_action_replaces_the_catalogues(host: HostFS) -> None:
    """Xid 160 (channel retirement): the catalogue says reboot the node; a driver that asks only for
    a GPU reset is followed."""
    nvml = NvmlStandin(GPUS)
    agent = agent_for(host, nvml)
    nvml.recovery[3] = GPU_RESET
    nvml.queue.append((3, XID_EVENT, 160))
    gpu = listed(agent.observe())["0000:44:00.0"]
    assert (gpu["state"], gpu["action"], gpu["xid"], gpu["recovery"]) == (
        "unhealthy",
        "reset-gpu",
        160,
        "gpu-reset",
    )


def test_without_the_field_the_catalogue_decides_and_the_report_has_no_recovery(host: HostFS) -> None:
    nvml = NvmlStandin(GPUS)  # NOT_SUPPORTED: a driver before 565
    agent = agent_for(host, nvml)
    nvml.queue.append((3, DBE_EVENT, 0))
    gpus = listed(agent.observe())
    assert (gpus["0000:44:00.0"]["state"], gpus["0000:44:00.0"]["action"]) == ("unhealthy", "reset-gpu")
    assert "recovery" not in gpus["0000:44:00.0"]


def test_a_report_without_recovery_still_parses() -> None:
    old = (
        '{"action":"reset-gpu","gpus":[{"action":"reset-gpu","bus":"0000:44:00.0","reason":"Xid 48","state":'
        '"unhealthy","xid":48}],"healthy":7,"sources":["kmsg","pci","proc"],"state":"unhealthy","v":1,'
        '"validated":true}'
    )
    assert HealthReport.parse(old).gpus[0].recovery is None


def test_the_numbers_are_the_pinned_bindings() -> None:
    import pynvml

    assert RECOVERY_FIELD == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    named = {
        getattr(pynvml, n): n.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower().replace("_", "-")
        for n in dir(pynvml)
        if n.startswith("NVML_GPU_RECOVERY_ACTION_")
    }
    assert named == RECOVERY_ACTIONS
    assert (NvmlStandin.NVML_ERROR_GPU_IS_LOST, NvmlStandin.NVML_ERROR_NOT_SUPPORTED) == (
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
    )


def test_the_real_bindings_read_the_recovery_field_where_the_driver_loads() -> None:
    """On a machine with NVIDIA's driver: the field reads (a known word, or absent before 565) and an
    event's device is told by its handle as the agent keeps it; without the library, NVML says why."""
    import pynvml

    source = NvmlSource(lambda _: None)
    try:
        if not source.available:
            assert source.reason.startswith("NVML unavailable")
            return
        observation = source.poll(set(source.buses.values()))
        assert observation is not None and set(observation.gpus) == set(source.buses.values())
        assert all(g.recovery in (None, *RECOVERY_ACTIONS.values()) for g in observation.gpus.values())
        for index, handle in source.handles.items():
            assert handle_key(pynvml.nvmlDeviceGetHandleByIndex(index)) == handle_key(handle)
    finally:
        source.close()
