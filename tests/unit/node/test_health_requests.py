"""The health agent's side of remediation on host trees (tests/fixtures/hosts): a reset request
carried out only for GPUs nothing holds (and never for one gone from the bus), its outcome per GPU
in the report (parsed by the operator's model), kured's sentinel created once per reboot request,
the handled requests removed with the report's patch, and nvidia-smi found and run as the driver
root says."""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest

from gpu_operator.api.health import HealthReport
from gpu_operator.node.health import HealthAgent, encode, run
from gpu_operator.node.health.requests import SENTINEL, RequestActor, smi_resetter
from gpu_operator.node.hostfs import HostFS
from gpu_operator.node.runner import CommandResult
from gpu_operator.vocabulary import HEALTH_REBOOT_REQUESTED, HEALTH_RESET_REQUESTED
from tests.unit.node.test_health import append, record, validated, xid_line

BUS = "0000:44:00.0"  # minor 3 on the fixture host
OTHER = "0000:c1:00.0"  # minor 7


class Resets:
    """A resetter that records what it was asked; `fail` makes it fail."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[str] = []
        self.fail = fail

    def __call__(self, bus: str) -> tuple[bool, str]:
        self.calls.append(bus)
        return (False, self.fail) if self.fail else (True, "")


def make_host(build_host: Any, processes: list[dict[str, Any]] | None = None) -> HostFS:
    fs: HostFS = build_host("h100-nvidia-bound", processes=processes or []).fs
    fs.write_text("/dev/kmsg", record("Linux version 6.8.0-generic"))
    validated(fs)
    return fs


def agent_with(fs: HostFS, resets: Resets) -> HealthAgent:
    logs: list[str] = []
    actor = RequestActor(fs, resets, own_pid=1, log=logs.append)
    agent = HealthAgent(fs, "node-a", nvml=False, log=logs.append, requests=actor)
    agent.logs = logs  # type: ignore[attr-defined]
    return agent


def report_of(agent: HealthAgent) -> HealthReport:
    return HealthReport.parse(encode(agent.observe()))


def test_a_reset_request_resets_a_free_gpu_clears_its_xid_and_is_withdrawn(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets()
    agent = agent_with(fs, resets)
    append(fs, xid_line("0000:44:00", 48))
    assert report_of(agent).unhealthy[0].bus == BUS
    withdraw = agent.act({HEALTH_RESET_REQUESTED: BUS})
    assert resets.calls == [BUS] and withdraw == [HEALTH_RESET_REQUESTED]
    report = report_of(agent)
    assert report.ready and report.unhealthy == ()
    assert report.reset_outcome(BUS) == ("done", "")
    # the removal not seen yet: the same request is not carried out twice
    assert agent.act({HEALTH_RESET_REQUESTED: BUS}) == [HEALTH_RESET_REQUESTED] and resets.calls == [BUS]
    # gone from the annotations, then asked again (a later attempt): a new request
    agent.act({})
    agent.act({HEALTH_RESET_REQUESTED: BUS})
    assert resets.calls == [BUS, BUS]


def test_a_held_gpu_is_not_reset_and_is_tried_again_once_free(build_host: Any) -> None:
    fs = make_host(build_host, [{"pid": 77, "comm": "python3", "fds": ["/dev/nvidia3"]},
                                {"pid": 1, "comm": "gpu-operator", "fds": ["/dev/nvidia7"]}])
    resets = Resets()
    agent = agent_with(fs, resets)
    append(fs, xid_line("0000:44:00", 48) + xid_line("0000:c1:00", 48))
    withdraw = agent.act({HEALTH_RESET_REQUESTED: f"{BUS},{OTHER}"})
    # the agent's own open file (pid 1 here) does not count; python3's does
    assert resets.calls == [OTHER] and withdraw == []
    report = report_of(agent)
    kind, why = report.reset_outcome(BUS) or ("", "")
    assert kind == "refused" and why.startswith("held by pid 77")
    assert report.reset_outcome(OTHER) == ("done", "")
    assert [g.bus for g in report.unhealthy] == [BUS]
    assert agent.act({HEALTH_RESET_REQUESTED: f"{BUS},{OTHER}"}) == [] and resets.calls == [OTHER]  # still held
    shutil.rmtree(fs.resolve("/proc/77"))  # the process ended
    assert agent.act({HEALTH_RESET_REQUESTED: f"{BUS},{OTHER}"}) == [HEALTH_RESET_REQUESTED]
    assert resets.calls == [OTHER, BUS] and report_of(agent).ready


def test_a_gone_gpu_is_refused_and_a_failed_reset_is_not_repeated(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets(fail="`nvidia-smi -r -i 0000:c1:00.0` exited 255: GPU in use")
    agent = agent_with(fs, resets)
    fs.remove(f"/sys/bus/pci/devices/{BUS}")
    agent.act({HEALTH_RESET_REQUESTED: f"{BUS},{OTHER}"})
    agent.act({HEALTH_RESET_REQUESTED: f"{BUS},{OTHER}"})
    assert resets.calls == [OTHER]  # once; never the gone GPU
    report = report_of(agent)
    assert report.reset_outcome(BUS) == ("refused", "gone from the bus (only a reboot brings it back)")
    kind, why = report.reset_outcome(OTHER) or ("", "")
    assert kind == "failed" and why.endswith("GPU in use")


def test_a_later_attempt_asking_for_the_same_gpus_is_a_new_request(build_host: Any) -> None:
    from gpu_operator.vocabulary import HEALTH_SINCE_ANNOTATION

    fs = make_host(build_host)
    resets = Resets(fail="exited 255")
    agent = agent_with(fs, resets)
    agent.act({HEALTH_RESET_REQUESTED: BUS, HEALTH_SINCE_ANNOTATION: "100"})
    agent.act({HEALTH_RESET_REQUESTED: BUS, HEALTH_SINCE_ANNOTATION: "100"})  # failed: not again
    assert resets.calls == [BUS]
    resets.fail = ""
    # the machine's next attempt (a new state stamp), its removal in between never seen
    assert agent.act({HEALTH_RESET_REQUESTED: BUS, HEALTH_SINCE_ANNOTATION: "160"}) == [HEALTH_RESET_REQUESTED]
    assert resets.calls == [BUS, BUS] and report_of(agent).reset_outcome(BUS) == ("done", "")


def test_all_means_every_gpu_of_the_node(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets()
    agent = agent_with(fs, resets)
    assert agent.act({HEALTH_RESET_REQUESTED: "all"}) == [HEALTH_RESET_REQUESTED]
    assert len(resets.calls) == 8 and len(report_of(agent).reset) == 8


def test_a_reboot_request_creates_the_sentinel_once(build_host: Any) -> None:
    fs = make_host(build_host)
    agent = agent_with(fs, Resets())
    actor = agent.requests
    assert actor is not None and not fs.exists(SENTINEL)
    assert agent.act({HEALTH_REBOOT_REQUESTED: "1700000000"}) == [HEALTH_REBOOT_REQUESTED]
    assert fs.is_file("/var/run/reboot-required") and actor.sentinel_writes == 1
    assert report_of(agent).reboot == "1700000000"
    fs.remove(SENTINEL)  # (say kured rebooted and /run was emptied) the old request seen again: not again
    assert agent.act({HEALTH_REBOOT_REQUESTED: "1700000000"}) == [HEALTH_REBOOT_REQUESTED]
    assert not fs.exists(SENTINEL) and actor.sentinel_writes == 1
    fs.write_text(SENTINEL, "packages\n")  # someone else's pending reboot: left as it is, the request taken
    assert agent.act({HEALTH_REBOOT_REQUESTED: "1700000100"}) == [HEALTH_REBOOT_REQUESTED]
    assert fs.read_text(SENTINEL) == "packages\n" and actor.sentinel_writes == 1
    assert report_of(agent).reboot == "1700000100"


class Publisher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    async def publish(self, text: str, withdraw: tuple[str, ...] = ()) -> None:
        self.calls.append((text, withdraw))


class Annotations:
    def __init__(self, notes: dict[str, str]) -> None:
        self.notes = notes

    def current(self) -> dict[str, str]:
        return self.notes


def test_the_loop_removes_handled_requests_with_the_report(build_host: Any) -> None:
    fs = make_host(build_host)
    agent = agent_with(fs, Resets())
    publisher, source = Publisher(), Annotations({})

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run(agent, publisher, 0.01, stop, source))
        await asyncio.sleep(0.1)
        append(fs, xid_line("0000:44:00", 48))
        await asyncio.sleep(0.1)
        source.notes = {HEALTH_RESET_REQUESTED: BUS}
        await asyncio.sleep(0.1)
        source.notes = {}  # the patch landed
        await asyncio.sleep(0.1)
        stop.set()
        await task

    asyncio.run(scenario())
    states = [(HealthReport.parse(t).state, w) for t, w in publisher.calls]
    assert states[:3] == [("healthy", ()), ("unhealthy", ()), ("healthy", (HEALTH_RESET_REQUESTED,))]
    # while the removal was not seen yet, the same removal may go out again; never a second reset
    assert all(w in ((), (HEALTH_RESET_REQUESTED,)) for _, w in publisher.calls)
    assert HealthReport.parse(publisher.calls[-1][0]).stopped


def test_nvidia_smi_is_run_through_the_driver_root(build_host: Any) -> None:
    fs: HostFS = build_host("operator-driver").fs

    class Runner:
        def __init__(self) -> None:
            self.calls: list[tuple[list[str], str | None]] = []

        def run(self, argv: list[str], *, root: str | None = "/", timeout: float = 60.0,
                env: Any = None) -> CommandResult:
            self.calls.append((list(argv), root))
            return CommandResult(tuple(argv), 0)

    runner = Runner()
    assert smi_resetter(fs, runner)(BUS) == (True, f"`{runner.calls[0][0][0]} -r -i {BUS}` exited 0")
    argv, root = runner.calls[0]
    assert argv[1:] == ["-r", "-i", BUS] and root == "/run/nvidia/driver" and argv[0].endswith("/nvidia-smi")


def test_no_nvidia_smi_fails_the_reset_naming_it(build_host: Any) -> None:
    fs: HostFS = build_host("cpu-only").fs
    ok, why = smi_resetter(fs, object())(BUS)
    assert not ok and why == "nvidia-smi not found on the host or in the driver root"


@pytest.mark.parametrize("text", ["done", "refused:held by pid 7 (x)", "failed:exit 1"])
def test_the_operator_reads_each_outcome(text: str) -> None:
    report = HealthReport.parse(encode({"v": 1, "validated": True, "state": "healthy", "action": "none",
                                        "healthy": 8, "gpus": [], "sources": ["pci"], "reset": {BUS: text}}))
    assert report.reset_outcome(BUS) == tuple(text.partition(":")[::2])


def test_the_node_watch_keeps_the_latest_annotations_and_watches_again_after_a_failure() -> None:
    import threading

    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node

    from gpu_operator.node.kubeapi import NodeAnnotationWatch

    done = threading.Event()

    class Client:
        def __init__(self) -> None:
            self.calls: list[dict[str, str]] = []

        def watch(self, resource: Any, fields: dict[str, str]) -> Any:
            self.calls.append(fields)
            if len(self.calls) == 1:
                yield "ADDED", Node(metadata=ObjectMeta(name="node-a", annotations={HEALTH_RESET_REQUESTED: BUS}))
                raise ConnectionError("apiserver away")
            yield "MODIFIED", Node(metadata=ObjectMeta(name="node-a", annotations={"other": "x"}))
            done.set()
            threading.Event().wait()  # the watch stays open

    client, logs = Client(), list[str]()
    watch = NodeAnnotationWatch("node-a", client, logs.append)
    assert done.wait(10)
    assert client.calls == [{"metadata.name": "node-a"}] * 2
    assert watch.current() == {"other": "x"}
    assert logs == ["watching Node node-a failed (apiserver away); watching again"]


def test_the_operator_refuses_an_outcome_it_does_not_know_naming_the_field() -> None:
    from gpu_operator.api.health import ReportError

    base = {"v": 1, "validated": True, "state": "healthy", "action": "none", "healthy": 8, "gpus": [],
            "sources": ["pci"]}
    with pytest.raises(ReportError, match=rf"field reset\.{BUS}: String should match pattern"):
        HealthReport.parse(encode({**base, "reset": {BUS: "ok"}}))
    with pytest.raises(ReportError, match=r"field reset\.0000:44:00\.\[key\]: String should match pattern"):
        HealthReport.parse(encode({**base, "reset": {"0000:44:00": "done"}}))  # not a bus id as sysfs names it


def test_the_command_runs_the_agent_with_requests_and_the_node_watch(build_host: Any, monkeypatch: Any) -> None:
    from typer.testing import CliRunner

    from gpu_operator.cli import app
    from gpu_operator.node import kubeapi
    from gpu_operator.node.health import agent as agent_module

    seen: dict[str, Any] = {}

    class Watch:
        def __init__(self, node: str, client: Any = None, log: Any = None) -> None:
            seen["watched"] = node

        def current(self) -> dict[str, str]:
            return {}

    async def fake_run(agent: HealthAgent, publisher: Any, interval: float, stop: Any, requests: Any = None) -> None:
        seen.update(agent=agent, publisher=publisher, requests=requests)

    monkeypatch.setattr(kubeapi, "new_client", lambda: object())
    monkeypatch.setattr(kubeapi, "NodeAnnotationWatch", Watch)
    monkeypatch.setattr(agent_module, "run", fake_run)
    root = build_host("h100-nvidia-bound").fs.root
    result = CliRunner().invoke(app, ["node", "health", "--host-root", str(root), "--node-name", "node-a",
                                      "--metrics-port", "0", "--no-nvml"])
    assert result.exit_code == 0, result.output
    assert seen["watched"] == "node-a" and isinstance(seen["requests"], Watch)
    actor = seen["agent"].requests
    assert isinstance(actor, RequestActor) and actor.sentinel == SENTINEL


def test_without_a_reset_request_acting_leaves_the_host_to_the_step(build_host: Any) -> None:
    """The loop acts before every step: with nothing asked (or only a reboot) the host is not read
    twice per step."""
    fs = make_host(build_host)
    agent = agent_with(fs, Resets())
    looks: list[int] = []
    observe = agent.observe

    def counted() -> dict[str, Any]:
        looks.append(1)
        return observe()

    agent.observe = counted  # type: ignore[method-assign]
    assert agent.act({}) == [] and looks == []
    assert agent.act({HEALTH_REBOOT_REQUESTED: "1"}) == [HEALTH_REBOOT_REQUESTED] and looks == []
    assert fs.exists(SENTINEL)
    agent.act({HEALTH_RESET_REQUESTED: BUS})
    assert looks == [1]
