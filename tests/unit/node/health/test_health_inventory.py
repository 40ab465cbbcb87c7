"""This boot's GPUs kept on the host (node/health/inventory.py): an agent started again on the
same boot knows a GPU that left the bus in between (gone, not absent); a new boot, a file of
another boot or a forged entry count for nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_operator.node.health import HealthAgent
from gpu_operator.node.health.inventory import BOOT_ID, INVENTORY, MAX_GPUS
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.vocabulary import VALIDATIONS_DIR

LOST = "0000:18:00.0"


@pytest.fixture
def host(build_host: Any) -> HostFS:
    """8x H100 bound to nvidia, validated, an empty kernel log, a boot."""
    fs: HostFS = build_host("h100-nvidia-bound").fs
    fs.write_text("/dev/kmsg", "")
    fs.write_text(BOOT_ID, "4f1f7d0c-2b2e-4b7e-9d3a-0c7f1d2a9e11\n")
    for component in ("driver", "toolkit", "cuda", "plugin"):
        fs.write_text(f"{VALIDATIONS_DIR}/{component}-ready", "")
    return fs


def agent(fs: HostFS) -> tuple[HealthAgent, list[str]]:
    logs: list[str] = []
    return HealthAgent(fs, "node-a", nvml=False, log=logs.append), logs


def states(report: dict[str, Any]) -> dict[str, str]:
    return {g["bus"]: g["state"] for g in report["gpus"]}


def test_an_agent_started_again_after_a_gpu_left_the_bus_reports_it_gone(host: HostFS) -> None:
    first, _ = agent(host)
    assert first.observe()["healthy"] == 8
    first.close()
    assert host.remove(f"/sys/bus/pci/devices/{LOST}")  # a surprise removal while no agent ran
    again, logs = agent(host)
    report = again.observe()
    assert states(report) == {LOST: "gone"} and report["state"] == "gone" and report["healthy"] == 7
    assert any(LOST in line for line in logs), logs


def test_a_new_boot_finds_its_gpus_anew(host: HostFS) -> None:
    agent(host)[0].close()
    assert host.remove(f"/sys/bus/pci/devices/{LOST}")
    host.write_text(BOOT_ID, "9a1e2f3b-0000-4000-8000-000000000001\n")  # rebooted: the list is another boot's
    report = agent(host)[0].observe()
    assert report["state"] == "healthy" and LOST not in states(report)
    assert json.loads(host.read_text(INVENTORY) or "")["bootId"].startswith("9a1e2f3b")


def test_forged_entries_count_for_nothing(host: HostFS) -> None:
    boot = (host.read_text(BOOT_ID) or "").strip()
    forged = {
        "not-a-bus": "nvidia",
        "0000:ZZ:00.0": None,
        **{f"0000:{i:02x}:1f.7": None for i in range(MAX_GPUS + 5)},
    }
    host.write_text(INVENTORY, json.dumps({"bootId": boot, "gpus": forged}))
    report = agent(host)[0].observe()
    assert "not-a-bus" not in states(report) and "0000:ZZ:00.0" not in states(report)
    # the first MAX_GPUS entries read (two of them no address), none after
    assert sum(1 for s in states(report).values() if s == "gone") == MAX_GPUS - 2
    host.write_text(INVENTORY, "{not json")
    assert agent(host)[0].observe()["state"] == "healthy"
    host.write_text(INVENTORY, json.dumps({"gpus": {LOST: "nvidia"}}))  # no boot: not this boot's
    assert agent(host)[0].observe()["state"] == "healthy"


def test_a_host_run_that_refuses_the_file_is_logged_and_the_agent_goes_on(host: HostFS) -> None:
    host.write_text("/run/nvidia/gpu-health", "a file where the directory should be")
    found, logs = agent(host)
    assert found.observe()["healthy"] == 8
    assert any(INVENTORY in line for line in logs), logs
