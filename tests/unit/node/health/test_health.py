"""The GPU health agent on host trees with real layouts (tests/fixtures/hosts): the kernel log
followed from where the agent starts, GPUs leaving the bus, the validator's status files, NVML
where it loads (a stand-in module here), the report's round trip through the operator's parser,
and one write per change."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.api.health import HealthReport, ReportError
from gpu_operator.cli import app
from gpu_operator.node.health import HealthMetrics, encode, run
from gpu_operator.node.health.catalogue import DEVICE_PLUGIN_APPLICATION_XIDS, classify
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.vocabulary import HEALTH_ACTIONS, VALIDATIONS_DIR
from tests.unit.node.health.healthkit import (
    GPUS,
    SEQ,
    FakeNvml,
    FakePublisher,
    agent_for,
    append,
    gpu,
    record,
    step,
    validated,
    xid_line,
)
from tests.unit.node.nodekit import FakeClock

# test_health_nvml and test_health_xid_lines import these from here (now in healthkit)
__all__ = ["GPUS", "SEQ", "validated"]


@pytest.fixture
def host(build_host: Any) -> HostFS:
    """8x H100 bound to nvidia (driver 550 loaded: /proc/driver/nvidia/gpus), validated, an empty kmsg."""
    fs: HostFS = build_host("h100-nvidia-bound").fs
    fs.write_text("/dev/kmsg", record("Linux version 6.8.0-generic"))
    validated(fs)
    return fs


def test_a_clean_node_is_healthy_and_validated(host: HostFS) -> None:
    report = agent_for(host).observe()
    assert report["state"] == "healthy" and report["action"] == "none"
    assert report["healthy"] == 8 and report["gpus"] == []
    assert report["validated"] is True and "missing" not in report
    assert report["sources"] == ["kmsg", "pci", "proc"]
    parsed = HealthReport.parse(encode(report))
    assert parsed.ready and parsed.healthy == 8


def test_xid_79_appended_after_start_makes_the_gpu_unhealthy_with_reboot(host: HostFS) -> None:
    agent = agent_for(host)
    assert agent.observe()["state"] == "healthy"
    append(host, xid_line("0000:0a:00", 79))
    report = agent.observe()
    entry = gpu(report, "0000:0a:00.0")
    assert (entry["state"], entry["action"], entry["xid"], entry["minor"]) == ("unhealthy", "reboot", 79, 0)
    assert report["state"] == "unhealthy" and report["action"] == "reboot" and report["healthy"] == 7
    parsed = HealthReport.parse(encode(report))
    assert not parsed.ready and [g.bus for g in parsed.unhealthy] == ["0000:0a:00.0"]


def test_xid_13_is_a_warning_with_restart_app_and_keeps_the_node_ready(host: HostFS) -> None:
    agent = agent_for(host)
    append(host, xid_line("0000:c1:00", 13))
    report = agent.observe()
    entry = gpu(report, "0000:c1:00.0")
    assert (entry["state"], entry["action"], entry["xid"]) == ("warning", "restart-app", 13)
    parsed = HealthReport.parse(encode(report))
    assert parsed.ready and parsed.unhealthy == () and parsed.state == "warning"


def test_lines_present_before_start_are_not_replayed(host: HostFS) -> None:
    append(host, xid_line("0000:0a:00", 79) + xid_line("0000:18:00", 48))
    agent = agent_for(host)
    assert agent.observe()["gpus"] == []
    assert step(agent) is not None and step(agent) is None
    # a restarted agent does not replay them either
    again = agent_for(host)
    assert again.observe()["healthy"] == 8


def test_an_unparseable_line_does_not_crash_and_later_lines_count(host: HostFS) -> None:
    agent = agent_for(host)
    garbage = (
        record("NVRM: Xid (PCI:zzzz:0a:00): 79, broken address")
        + "no header at all\n"
        + "\x00\xff" * 3000
        + "\n"
        + record("NVRM: Xid (PCI:0000:0a:00): notanumber")
        + "3,1,2,-;"
        + "x" * 10_000
        + "\n"
    )
    append(host, garbage)
    report = agent.observe()
    assert report["gpus"] == [] and report["healthy"] == 8
    assert agent.kernel_xids.ignored == {"unparsed": 2}
    append(host, xid_line("0000:18:00", 95))
    assert gpu(agent.observe(), "0000:18:00.0")["action"] == "reset-gpu"


def test_a_line_split_across_two_polls_is_read_once_whole(host: HostFS) -> None:
    agent = agent_for(host)
    line = xid_line("0000:3b:00", 79)
    append(host, line[:20])
    assert agent.observe()["gpus"] == []
    append(host, line[20:])
    assert gpu(agent.observe(), "0000:3b:00.0")["xid"] == 79


def test_a_gpu_removed_from_sysfs_is_gone(host: HostFS) -> None:
    agent = agent_for(host)
    assert agent.observe()["healthy"] == 8
    assert host.remove("/sys/bus/pci/devices/0000:18:00.0")
    report = agent.observe()
    entry = gpu(report, "0000:18:00.0")
    assert (entry["state"], entry["action"]) == ("gone", "reboot")
    assert report["state"] == "gone" and report["healthy"] == 7
    assert HealthReport.parse(encode(report)).unhealthy[0].state == "gone"


def test_the_driver_dropping_a_gpu_it_still_owns_is_unhealthy(host: HostFS) -> None:
    agent = agent_for(host)
    import shutil

    shutil.rmtree(host.resolve("/proc/driver/nvidia/gpus/0000:44:00.0"))
    entry = gpu(agent.observe(), "0000:44:00.0")
    assert (entry["state"], entry["action"]) == ("unhealthy", "reset-gpu")


def test_missing_status_files_mean_not_validated(host: HostFS) -> None:
    assert host.remove(f"{VALIDATIONS_DIR}/plugin-ready")
    report = agent_for(host).observe()
    assert report["validated"] is False and report["missing"] == ["plugin"]
    assert not HealthReport.parse(encode(report)).ready
    only_driver = agent_for(host, validations=("driver",)).observe()
    assert only_driver["validated"] is True


def test_one_write_per_change_and_none_while_nothing_changes(host: HostFS) -> None:
    agent = agent_for(host)
    publisher = FakePublisher()

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run(agent, publisher, 0.01, stop))
        await asyncio.sleep(0.15)  # ~15 steps, nothing changes
        assert len(publisher.texts) == 1
        append(host, xid_line("0000:87:00", 79))
        await asyncio.sleep(0.15)
        assert len(publisher.texts) == 2
        stop.set()
        await task

    asyncio.run(scenario())
    reports = [HealthReport.parse(t) for t in publisher.texts]
    assert [r.state for r in reports] == ["healthy", "unhealthy", "unhealthy"]
    assert [r.stopped for r in reports] == [False, False, True]


def test_a_failed_write_is_retried_at_the_next_step_only_until_it_lands(host: HostFS) -> None:
    class Flaky(FakePublisher):
        fails = 2

        async def publish(self, text: str, withdraw: tuple[str, ...] = ()) -> None:
            if self.fails:
                self.fails -= 1
                raise ConnectionError("apiserver away")
            await super().publish(text, withdraw)

    agent, publisher = agent_for(host), Flaky()

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run(agent, publisher, 0.01, stop))
        await asyncio.sleep(0.15)
        stop.set()
        await task

    asyncio.run(scenario())
    assert len(publisher.texts) == 2  # the first report once it landed, then the final one
    assert sum("publishing the report failed" in line for line in agent.logs) == 2  # type: ignore[attr-defined]


def test_warnings_lapse_after_the_hold_and_unhealthy_stays(host: HostFS) -> None:
    clock = FakeClock()
    agent = agent_for(host, clock=clock, warning_hold=60)
    append(host, xid_line("0000:0a:00", 13) + xid_line("0000:18:00", 79))
    assert step(agent) is not None
    clock.now += 59
    assert step(agent) is None
    clock.now += 1
    report = step(agent)
    assert report is not None and [g["bus"] for g in report["gpus"]] == ["0000:18:00.0"]


def test_a_milder_xid_does_not_hide_a_worse_one(host: HostFS) -> None:
    agent = agent_for(host)
    append(host, xid_line("0000:0a:00", 79) + xid_line("0000:0a:00", 13))
    entry = gpu(agent.observe(), "0000:0a:00.0")
    assert (entry["xid"], entry["action"]) == (79, "reboot")


def test_without_nvml_the_kernel_log_and_sysfs_still_work(host: HostFS) -> None:
    class NoLibrary:
        class NVMLError(Exception):
            pass

        def nvmlInit(self) -> None:  # noqa: N802 - NVML's name
            raise self.NVMLError("NVML Shared Library Not Found")

    agent = agent_for(host, nvml=True, nvml_module=NoLibrary())
    assert any(
        line.startswith("NVML unavailable") and "kernel log and sysfs only" in line
        for line in agent.logs  # type: ignore[attr-defined]
    )
    append(host, xid_line("0000:0a:00", 79))
    host.remove("/sys/bus/pci/devices/0000:18:00.0")
    report = agent.observe()
    assert "nvml" not in report["sources"]
    assert (
        gpu(report, "0000:0a:00.0")["state"] == "unhealthy" and gpu(report, "0000:18:00.0")["state"] == "gone"
    )


def test_nvml_events_and_state_join_the_report(host: HostFS) -> None:
    fake = FakeNvml(GPUS)
    metrics = HealthMetrics()
    agent = agent_for(host, nvml=True, nvml_module=fake, metrics=metrics)
    assert set(fake.registered.values()) == {
        0x8 | 0x2
    }  # Xid critical and double-bit ECC, as the device plugin
    fake.queue += [(2, 0x8, 79), (3, 0x2, 0)]
    fake.lost.add(4)
    report = agent.observe()
    assert report["sources"] == ["kmsg", "nvml", "pci", "proc"]
    assert (gpu(report, "0000:3b:00.0")["xid"], gpu(report, "0000:3b:00.0")["index"]) == (79, 2)
    assert (gpu(report, "0000:44:00.0")["xid"], gpu(report, "0000:44:00.0")["action"]) == (48, "reset-gpu")
    assert gpu(report, "0000:87:00.0")["state"] == "gone"
    assert (gpu(report, "0000:90:00.0")["state"], gpu(report, "0000:90:00.0")["action"]) == (
        "warning",
        "reset-gpu",
    )
    assert report["healthy"] == 4
    value = metrics.registry.get_sample_value
    assert (
        value(
            "gpu_operator_gpu_xid_total",
            {"gpu": "0000:3b:00.0", "xid": "79", "action": "reboot", "source": "nvml"},
        )
        == 1
    )
    assert value("gpu_operator_gpu_health_state", {"gpu": "0000:87:00.0", "state": "gone"}) == 1
    assert value("gpu_operator_gpu_health_state", {"gpu": "0000:0a:00.0", "state": "healthy"}) == 1
    assert value("gpu_operator_gpu_health_state", {"gpu": "0000:0a:00.0", "state": "gone"}) == 0
    assert value("gpu_operator_gpu_health_validated") == 1
    HealthReport.parse(encode(report))


def test_the_real_bindings_use_nvml_exactly_where_the_driver_library_loads(host: HostFS) -> None:
    """nvidia-ml-py is installed (pinned). Without libnvidia-ml (the test machines) NVML is left out
    and says so; on a machine with NVIDIA's driver it is one of the sources."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")  # the name nvidia-ml-py loads on Linux
        driver = True
    except OSError:
        driver = False
    agent = agent_for(host, nvml=True)
    loaded = agent.nvml is not None and agent.nvml.available
    assert loaded == driver
    if loaded:
        assert "nvml" in agent.observe()["sources"]
        return
    assert "nvml" not in agent.observe()["sources"]
    assert any(line.startswith("NVML unavailable") for line in agent.logs)  # type: ignore[attr-defined]


def test_kmsg_created_or_replaced_after_start_is_read_from_its_beginning(host: HostFS) -> None:
    host.remove("/dev/kmsg")
    agent = agent_for(host)
    assert "kmsg" not in agent.observe()["sources"]
    host.write_text("/dev/kmsg", xid_line("0000:0a:00", 79))
    assert gpu(agent.observe(), "0000:0a:00.0")["xid"] == 79
    host.write_atomic("/dev/kmsg", xid_line("0000:18:00", 79))  # another inode
    assert gpu(agent.observe(), "0000:18:00.0")["xid"] == 79


def test_catalogue_classes() -> None:
    assert (classify(79).action, classify(79).state, classify(79).bucket) == (
        "reboot",
        "unhealthy",
        "RESTART_BM",
    )
    assert (classify(13).action, classify(13).state) == ("restart-app", "warning")
    assert (classify(48).action, classify(48).state) == ("reset-gpu", "unhealthy")
    assert (classify(109).bucket, classify(109).state) == ("RESET_GPU", "warning")  # the device plugin's rule
    assert all(classify(x).state != "unhealthy" for x in DEVICE_PLUGIN_APPLICATION_XIDS)
    assert (classify(63).action, classify(63).state) == ("none", "healthy")  # IGNORE
    assert (classify(999).bucket, classify(999).action, classify(999).state) == ("UNKNOWN", "none", "warning")
    assert {classify(x).action for x in range(1, 170)} <= set(HEALTH_ACTIONS)


def test_the_parser_refuses_garbage_naming_the_field() -> None:
    good = {
        "v": 1,
        "validated": True,
        "state": "healthy",
        "action": "none",
        "healthy": 1,
        "gpus": [],
        "sources": ["pci"],
    }
    assert HealthReport.parse(json.dumps(good)).ready
    cases = {
        "not json{": "not JSON",
        "[1]": "not an object",
        json.dumps({**good, "v": 2}): "schema version",
        json.dumps({**good, "healthy": -1}): "field healthy",
        json.dumps({**good, "extra": 1}): "field extra",
        json.dumps(
            {
                **good,
                "gpus": [{"bus": "41:00", "state": "gone", "action": "reboot", "reason": ""}],
                "state": "gone",
            }
        ): "field gpus.0.bus",
        json.dumps(
            {
                **good,
                "gpus": [{"bus": "0000:41:00.0", "state": "gone", "action": "wipe", "reason": ""}],
                "state": "gone",
            }
        ): "field gpus.0.action",
        json.dumps({**good, "state": "unhealthy"}): "not the worst GPU state",
        json.dumps({**good, "missing": ["cuda"]}): "validated is true but missing",
        json.dumps({**good, "validated": "yes"}): "field validated",
    }
    for text, expected in cases.items():
        with pytest.raises(ReportError) as err:
            HealthReport.parse(text)
        assert expected in str(err.value), (text, str(err.value))


def test_once_prints_a_report_that_includes_the_log_present_now(host: HostFS) -> None:
    append(host, xid_line("0000:0a:00", 79))
    result = CliRunner().invoke(app, ["node", "health", "--once", "--no-nvml", "--host-root", str(host.root)])
    assert result.exit_code == 0, result.output
    report = HealthReport.parse(json.dumps(json.loads(result.stdout)))
    assert [(g.bus, g.xid, g.action) for g in report.gpus] == [("0000:0a:00.0", 79, "reboot")]


def test_the_command_refuses_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["node", "health", "--once", "--host-root", str(tmp_path), "--validations", "drvier"]
    )
    assert result.exit_code == 2 and "--validations" in result.output
    result = runner.invoke(
        app, ["node", "health", "--host-root", str(tmp_path), "--metrics-port", "0"], env={"NODE_NAME": ""}
    )
    assert result.exit_code == 2 and "--node-name" in result.output


def test_sigterm_stops_the_loop_cleanly_with_a_final_report(host: HostFS) -> None:
    import os
    import signal

    from gpu_operator.node.health.agent import install_stop

    agent, publisher = agent_for(host), FakePublisher()

    async def scenario() -> None:
        stop = asyncio.Event()
        install_stop(stop)
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(run(agent, publisher, 0.02, stop), timeout=5)

    asyncio.run(scenario())
    assert [HealthReport.parse(t).stopped for t in publisher.texts] == [False, True]
    assert agent.kmsg.fd is None  # closed


def test_the_annotation_publisher_merge_patches_the_report_only() -> None:
    from gpu_operator.node.health import AnnotationPublisher

    class Client:
        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def patch(self, kind: Any, name: str, body: dict[str, Any], patch_type: Any) -> None:
            self.calls.append((kind.__name__, name, body, str(patch_type)))

    client = Client()
    publisher = AnnotationPublisher("node-a", client=client)
    asyncio.run(publisher.publish('{"v":1}'))
    assert client.calls == [
        (
            "Node",
            "node-a",
            {"metadata": {"annotations": {"nvidia.com/gpu-health.report": '{"v":1}'}}},
            "PatchType.MERGE",
        )
    ]
    assert publisher.patches == 1


def test_a_gpu_nvml_cannot_reach_at_start_leaves_nvml_on_for_the_others(host: HostFS) -> None:
    fake = FakeNvml(GPUS)
    fake.lost_at_start.add(7)
    agent = agent_for(host, nvml=True, nvml_module=fake)
    assert sorted(fake.registered) == [0, 1, 2, 3, 4, 5, 6]
    assert any("GPU 7 does not answer" in line for line in agent.logs)  # type: ignore[attr-defined]
    fake.queue.append((1, 0x8, 62))
    report = agent.observe()
    assert "nvml" in report["sources"] and gpu(report, "0000:18:00.0")["action"] == "reset-gpu"


def test_a_kmsg_device_that_opens_late_is_read_from_its_end(tmp_path: Path) -> None:
    """The real /dev/kmsg device node (1:11) in a host tree: from its end, even when it could not be
    opened at the agent's start (a regular file appearing late is read whole instead)."""
    import os
    import stat

    from gpu_operator.node.health.kmsg import KmsgFollower

    fs = HostFS(tmp_path)
    fs.mkdir("/dev")
    follower = KmsgFollower(fs)
    assert follower.fd is None and follower.error
    try:
        os.mknod(fs.resolve("/dev/kmsg"), stat.S_IFCHR | 0o600, os.makedev(1, 11))
        whole = KmsgFollower(fs, from_start=True)
    except PermissionError:
        pytest.fail(
            "this test makes /dev/kmsg's device node in a host tree: run the suite as root (CAP_MKNOD)"
        )
    held = whole.poll()
    whole.close()
    assert not whole.error, f"the kernel log cannot be read here: {whole.error}"
    assert len(held) >= 20, f"the kernel log holds {len(held)} records: too few to tell start from end"
    late = follower.poll()
    follower.close()
    assert follower.regular is False and len(late) < len(held) // 2  # only what the kernel wrote meanwhile
