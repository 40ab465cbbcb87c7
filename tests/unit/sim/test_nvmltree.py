"""The simulator's NVML (`sim/hardware/nvmltree.py`) under the health agent's own NVML code: the recovery
action NVIDIA's driver keeps per GPU from driver 565 (`sim/hardware/recovery.py`), the driver's Xid 154
record when it changes, a reset and a reboot returning it to none, a GPU off the bus answering
GPU_IS_LOST, each Xid delivered once as an NVML event, and no field below 565."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.api.health import HealthReport
from gpu_operator.node.health import HealthAgent
from gpu_operator.node.health.catalogue import XID_LINE
from gpu_operator.node.health.kmsg import read_records
from gpu_operator.node.health.nvml import RECOVERY_FIELD
from gpu_operator.sim.hardware import faults, recovery
from gpu_operator.sim.hardware.nvmltree import GPU_IS_LOST, NOT_SUPPORTED, TIMEOUT, XID_EVENT, TreeNvml

NEW_DRIVER = "570.133.20"  # from 565 the driver keeps a recovery action
OLD_DRIVER = faults.node_host_spec("dgx-h100")["driver_version"]  # the simulator's (550.127.05)


def host(tmp_path: Path, version: str, node: str = "gpu-node-0") -> faults.HostFaults:
    spec = faults.node_host_spec("dgx-h100")
    spec["driver_version"] = version
    return faults.NodeHosts(tmp_path / "hosts").faults(node, spec)


def agent(tree: faults.HostFaults, module: TreeNvml | None = None) -> HealthAgent:
    return HealthAgent(
        tree.fs,
        "gpu-node-0",
        validations=(),
        nvml=True,
        nvml_module=module or TreeNvml(tree.fs),
        log=lambda _m: None,
    )


def entry(report: dict[str, Any], bus: str) -> dict[str, Any]:
    (found,) = [g for g in report["gpus"] if g["bus"] == bus]
    return dict(found)


def field(module: TreeNvml, index: int) -> tuple[int, int]:
    (value,) = module.nvmlDeviceGetFieldValues(module.nvmlDeviceGetHandleByIndex(index), [RECOVERY_FIELD])
    return value.nvmlReturn, value.value.uiVal


def kernel_xids(tree: faults.HostFaults) -> list[tuple[int, str]]:
    """The driver's Xid records in the tree's kernel log (facility kern, as the agent takes them)."""
    out = []
    for record in read_records(tree.fs) or []:
        found = XID_LINE.match(record.message)
        if found and record.facility == 0:
            out.append((int(found.group(2)), found.group(3).strip()))
    return out


def test_an_xid_of_bucket_reset_gpu_asks_for_a_gpu_reset_and_a_reset_returns_it_to_none(
    tmp_path: Path,
) -> None:
    tree = host(tmp_path, NEW_DRIVER)
    module = TreeNvml(tree.fs)
    health = agent(tree, module)
    assert health.observe()["gpus"] == []  # healthy: the field reads none
    assert field(module, 1) == (0, recovery.NONE)
    gpu = tree.xid(95, 1)  # uncontained ECC error: the catalogue's RESET_GPU
    report = health.observe()
    assert (entry(report, gpu.address)["recovery"], entry(report, gpu.address)["action"]) == (
        "gpu-reset",
        "reset-gpu",
    )
    assert (report["state"], report["action"], entry(report, gpu.address)["xid"]) == (
        "unhealthy",
        "reset-gpu",
        95,
    )
    assert "nvml" in report["sources"]
    # the driver logged Xid 154 after the Xid, in its own words
    assert kernel_xids(tree) == [
        (95, "pid='<unknown>', name=<unknown>"),
        (154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
    ]
    tree.xid(95, 1)  # the same action again: no change, no second Xid 154
    assert [x for x, _ in kernel_xids(tree)] == [95, 154, 95]
    tree.reset(gpu.address)  # nvidia-smi -r: the GPU is made anew, its action none (no Xid 154)
    assert field(module, 1) == (0, recovery.NONE)
    assert [x for x, _ in kernel_xids(tree)] == [95, 154, 95]
    assert (
        entry(health.observe(), gpu.address)["recovery"] == "none"
    )  # the Xid seen stays, the driver asks nothing


def test_restart_bm_asks_for_a_node_reboot_ahead_of_a_reset_and_a_reboot_clears_it(tmp_path: Path) -> None:
    tree = host(tmp_path, NEW_DRIVER)
    module = TreeNvml(tree.fs)
    health = agent(tree, module)
    gpu = tree.xid(95, 2)
    tree.xid(160, 2)  # channel retirement: RESTART_BM
    tree.xid(95, 2)  # a reset asked again does not lower a reboot
    assert field(module, 2) == (0, recovery.NODE_REBOOT)
    assert entry(health.observe(), gpu.address)["recovery"] == "node-reboot"
    assert [m for x, m in kernel_xids(tree) if x == 154] == [
        "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)",
    ]
    tree.xid(13, 3)  # RESTART_APP: the action stays none, nothing logged
    assert field(module, 3) == (0, recovery.NONE) and [x for x, _ in kernel_xids(tree)][-1] == 13
    tree.clear()  # a reboot
    assert field(module, 2) == (0, recovery.NONE)


def test_a_gpu_off_the_bus_answers_gpu_is_lost(tmp_path: Path) -> None:
    tree = host(tmp_path, NEW_DRIVER)
    module = TreeNvml(tree.fs)
    health = agent(tree, module)
    handle = module.nvmlDeviceGetHandleByIndex(4)
    gone = tree.gone(4)
    for call in (
        lambda: module.nvmlDeviceGetHandleByIndex(4),
        lambda: module.nvmlDeviceGetPciInfo(handle),
        lambda: module.nvmlDeviceGetFieldValues(handle, [RECOVERY_FIELD]),
    ):
        with pytest.raises(module.NVMLError) as err:
            call()
        assert err.value.value == GPU_IS_LOST
    report = health.observe()
    assert (entry(report, gone.address)["state"], entry(report, gone.address)["xid"]) == ("gone", 79)
    # NVML started now: its count keeps the GPU, whose handle is refused as lost
    later = agent(tree)
    assert later.nvml is not None and later.nvml.unidentified == {4: GPU_IS_LOST}


def test_each_xid_is_one_event_for_the_sets_made_before_it(tmp_path: Path) -> None:
    tree = host(tmp_path, NEW_DRIVER)
    module = TreeNvml(tree.fs)
    module.nvmlInit()
    before = module.nvmlEventSetCreate()
    for index in range(module.nvmlDeviceGetCount()):
        module.nvmlDeviceRegisterEvents(module.nvmlDeviceGetHandleByIndex(index), XID_EVENT, before)
    tree.xid(31, 0)
    tree.xid(95, 6)
    after = module.nvmlEventSetCreate()  # made after both: gets neither
    module.nvmlDeviceRegisterEvents(module.nvmlDeviceGetHandleByIndex(6), XID_EVENT, after)
    got = [module.nvmlEventSetWait_v2(before, 0) for _ in range(2)]
    assert [(e.device.index, e.eventType, e.eventData) for e in got] == [
        (0, XID_EVENT, 31),
        (6, XID_EVENT, 95),
    ]
    for events in (before, after):
        with pytest.raises(module.NVMLError) as err:
            module.nvmlEventSetWait_v2(events, 0)
        assert err.value.value == TIMEOUT
    tree.xid(43, 6)
    assert module.nvmlEventSetWait_v2(after, 0).eventData == 43


def test_below_driver_565_the_field_is_not_supported_and_no_xid_154_is_logged(tmp_path: Path) -> None:
    assert not recovery.supported(OLD_DRIVER) and recovery.supported(NEW_DRIVER)
    tree = host(tmp_path, OLD_DRIVER)
    module = TreeNvml(tree.fs)
    health = agent(tree, module)
    gpu = tree.xid(95, 1)
    assert field(module, 1)[0] == NOT_SUPPORTED
    found = entry(health.observe(), gpu.address)
    assert "recovery" not in found and found["action"] == "reset-gpu"  # the catalogue decides alone
    assert [x for x, _ in kernel_xids(tree)] == [95]


def test_the_health_stand_in_reports_the_recovery_action_and_a_reset_request_clears_it(
    tmp_path: Path,
) -> None:
    """On a kwok node whose host runs a 565+ driver, the live agent reads NVML from its tree: the
    report carries the driver's action; the operator's reset request resets the GPU on the tree
    and the field is none again."""
    from tests.unit.sim.test_health_standin import Harness, pod

    harness = Harness(tmp_path)

    async def go() -> None:
        await harness.standin.start(None)  # type: ignore[arg-type]
        await harness.sync("n", pod("n"))
        tree = host(tmp_path, NEW_DRIVER, node="n")  # the node's own tree, made at its first fault
        gpu = tree.xid(95, 3)
        await harness.sync("n", pod("n"))
        report = harness.client.reports("n")[-1]
        assert "nvml" in report["sources"]
        assert (entry(report, gpu.address)["recovery"], entry(report, gpu.address)["action"]) == (
            "gpu-reset",
            "reset-gpu",
        )
        harness.client.ask("n", "reset-gpu", [gpu.address], "100")
        await harness.sync("n", pod("n"))
        after = HealthReport.parse(json.dumps(harness.client.reports("n")[-1]))
        assert after.reset_outcome(gpu.address) == ("done", "")
        probe = TreeNvml(tree.fs)
        probe.nvmlInit()
        assert after.gpus == () and field(probe, 3) == (0, recovery.NONE)

    asyncio.run(go())
