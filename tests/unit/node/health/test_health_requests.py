"""The health agent's side of remediation on host trees (tests/fixtures/hosts): only the operator's
request (its node's entry in the requests Secret, admitted for the attempt the Node is in) is
carried out, never a Node annotation; a reset only for GPUs nothing holds (the agent known by its
host PID, NVML let go first) and never for one gone from the bus, its outcome per GPU in the report
(parsed by the operator's model), kured's sentinel created once per reboot request, the request
answered in the report, and nvidia-smi found and run as the driver root says."""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import pytest

from gpu_operator.api.health import HealthReport
from gpu_operator.node.health import run
from gpu_operator.node.health.requests import (
    SENTINEL,
    Request,
    RequestActor,
    Seen,
    own_host_pid,
    smi_resetter,
)
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runner import CommandResult
from gpu_operator.vocabulary import HEALTH_ATTEMPTS_ANNOTATION, HEALTH_SINCE_ANNOTATION, HEALTH_STATE
from tests.unit.node.health.healthkit import (
    AGENT_PID,
    BUS,
    OTHER,
    Resets,
    agent_with,
    append,
    asked,
    make_host,
    report_of,
    xid_line,
)


def test_a_reset_request_resets_a_free_gpu_clears_its_xid_and_is_answered(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets()
    agent = agent_with(fs, resets)
    append(fs, xid_line("0000:44:00", 48))
    assert report_of(agent).unhealthy[0].bus == BUS
    assert agent.act(asked()) is True
    assert resets.calls == [BUS]
    report = report_of(agent)
    assert report.ready and report.unhealthy == ()
    assert report.reset_outcome(BUS) == ("done", "") and report.answered == "reset-gpu:0:100"
    # its withdrawal not seen yet: the same request is not carried out twice
    assert agent.act(asked()) is False and resets.calls == [BUS]
    agent.act(Seen())  # withdrawn
    agent.act(asked(attempt=1, since="160"))  # a later attempt: a new request
    assert resets.calls == [BUS, BUS] and report_of(agent).answered == "reset-gpu:1:160"


@pytest.mark.parametrize(
    ("seen", "why"),
    [
        (
            Seen(
                {HEALTH_STATE: "validating"},
                {
                    HEALTH_SINCE_ANNOTATION: "100",
                    "nvidia.com/gpu-health.reset-requested": BUS,
                    "nvidia.com/gpu-health.reboot-requested": "100",
                },
            ),
            "",
        ),
        (asked(node="node-b"), "the request names node 'node-b', not this node (node-a)"),
        (asked(remediation=False), "the request says remediation is off"),
        (
            asked(state="quarantined"),
            "the request belongs to attempt 0 since 100; the Node is in state "
            "'quarantined', attempts 0, since 100",
        ),
        (
            asked(notes={HEALTH_SINCE_ANNOTATION: "90"}),
            "the request belongs to attempt 0 since 100; the Node is "
            "in state 'validating', attempts 0, since 90",
        ),
        (
            asked(notes={HEALTH_ATTEMPTS_ANNOTATION: "2"}),
            "the request belongs to attempt 0 since 100; the Node is "
            "in state 'validating', attempts 2, since 100",
        ),
        (
            Seen({HEALTH_STATE: "validating"}, {HEALTH_SINCE_ANNOTATION: "100"}, '{"v":1,"node":"node-a"}'),
            "the request for this node is unreadable: field action: None is none of reset-gpu, reboot",
        ),
    ],
    ids=[
        "node-annotations",
        "another-node",
        "remediation-off",
        "not-validating",
        "another-since",
        "another-attempt",
        "unreadable",
    ],
)
def test_nothing_but_the_operators_request_for_this_attempt_is_carried_out(
    build_host: Any, seen: Seen, why: str
) -> None:
    fs = make_host(build_host)
    resets = Resets()
    agent = agent_with(fs, resets)
    append(fs, xid_line("0000:44:00", 48))
    assert agent.act(seen) is False
    assert resets.calls == [] and not fs.exists(SENTINEL)
    report = report_of(agent)
    assert report.reset == {} and report.answered is None and report.reboot is None
    ignored = [m for m in agent.logs if m.startswith("remediation request ignored: ")]  # type: ignore[attr-defined]
    assert ignored == ([f"remediation request ignored: {why}"] if why else [])


def test_a_held_gpu_is_not_reset_and_is_tried_again_once_free(build_host: Any) -> None:
    # pid 1 is some host process (the agent is pid 1 only inside its container); AGENT_PID is the agent
    fs = make_host(
        build_host,
        [
            {"pid": 77, "comm": "python3", "fds": ["/dev/nvidia3"]},
            {"pid": 1, "comm": "systemd", "fds": ["/dev/nvidia3"]},
            {"pid": AGENT_PID, "comm": "gpu-operator", "fds": ["/dev/nvidia7"]},
        ],
    )
    resets = Resets()
    agent = agent_with(fs, resets)
    assert own_host_pid(fs) == AGENT_PID
    append(fs, xid_line("0000:44:00", 48) + xid_line("0000:c1:00", 48))
    assert agent.act(asked(gpus=[BUS, OTHER])) is False
    # the agent's own open file does not count; python3's and pid 1's do
    assert resets.calls == [OTHER]
    report = report_of(agent)
    kind, why = report.reset_outcome(BUS) or ("", "")
    assert kind == "refused" and why == "held by pid 1 (systemd), pid 77 (python3)"
    assert report.reset_outcome(OTHER) == ("done", "") and report.answered is None
    assert [g.bus for g in report.unhealthy] == [BUS]
    assert agent.act(asked(gpus=[BUS, OTHER])) is False and resets.calls == [OTHER]  # still held
    shutil.rmtree(fs.resolve("/proc/77"))
    shutil.rmtree(fs.resolve("/proc/1"))  # the processes ended
    assert agent.act(asked(gpus=[BUS, OTHER])) is True
    assert resets.calls == [OTHER, BUS] and report_of(agent).ready


def test_without_its_host_pid_every_holder_counts(build_host: Any) -> None:
    fs = make_host(build_host, [{"pid": AGENT_PID, "comm": "gpu-operator", "fds": ["/dev/nvidia3"]}])
    fs.remove("/proc/self/status")
    resets = Resets()
    agent = agent_with(fs, resets)
    agent.act(asked())
    assert resets.calls == [] and report_of(agent).reset_outcome(BUS) == (
        "refused",
        f"held by pid {AGENT_PID} (gpu-operator)",
    )


def test_nvml_is_let_go_before_the_holders_are_read(build_host: Any) -> None:
    fs = make_host(build_host)
    order: list[str] = []

    def reset(_bus: str) -> tuple[bool, str]:
        order.append("reset")
        return True, ""

    def holders(_fs: Any) -> list[Any]:
        order.append("holders")
        return []

    actor = RequestActor(fs, reset, holders=holders, log=lambda _m: None)
    actor.before_reset = lambda: order.append("nvml let go")
    actor.act(Request.parse(asked().request or ""), {BUS}, set())
    assert order == ["nvml let go", "holders", "reset"]


def test_a_gone_gpu_is_refused_and_a_failed_reset_is_not_repeated(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets(fail="`nvidia-smi -r -i 0000:c1:00.0` exited 255: GPU in use")
    agent = agent_with(fs, resets)
    fs.remove(f"/sys/bus/pci/devices/{BUS}")
    agent.act(asked(gpus=[BUS, OTHER]))
    agent.act(asked(gpus=[BUS, OTHER]))
    assert resets.calls == [OTHER]  # once; never the gone GPU
    report = report_of(agent)
    assert report.reset_outcome(BUS) == ("refused", "gone from the bus (only a reboot brings it back)")
    kind, why = report.reset_outcome(OTHER) or ("", "")
    assert kind == "failed" and why.endswith("GPU in use") and report.answered is None


def test_all_means_every_gpu_of_the_node(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets()
    agent = agent_with(fs, resets)
    assert agent.act(asked(gpus=["all"])) is True
    assert len(resets.calls) == 8 and len(report_of(agent).reset) == 8


def test_a_reboot_request_creates_the_sentinel_once(build_host: Any) -> None:
    fs = make_host(build_host)
    agent = agent_with(fs, Resets())
    actor = agent.requests
    assert actor is not None and not fs.exists(SENTINEL)
    assert agent.act(asked("reboot")) is True
    assert fs.is_file("/var/run/reboot-required") and actor.sentinel_writes == 1
    assert report_of(agent).reboot == "reboot:0:100" and report_of(agent).answered == "reboot:0:100"
    fs.remove(SENTINEL)  # (say kured rebooted and /run was emptied) the old request seen again: not again
    assert agent.act(asked("reboot")) is False
    assert not fs.exists(SENTINEL) and actor.sentinel_writes == 1
    fs.write_text(SENTINEL, "packages\n")  # someone else's pending reboot: left as it is, the request taken
    assert agent.act(asked("reboot", attempt=1, since="200")) is True
    assert fs.read_text(SENTINEL) == "packages\n" and actor.sentinel_writes == 1
    assert report_of(agent).answered == "reboot:1:200"


class Publisher:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def publish(self, text: str) -> None:
        self.calls.append(text)


class Requests:
    def __init__(self) -> None:
        self.seen = Seen()

    def current(self) -> Seen:
        return self.seen


def test_the_loop_answers_a_request_in_the_report(build_host: Any) -> None:
    fs = make_host(build_host)
    resets = Resets()
    agent = agent_with(fs, resets)
    publisher, source = Publisher(), Requests()

    async def until(what: Any) -> None:
        for _ in range(500):
            if what():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run(agent, publisher, 0.01, stop, source))
        await until(lambda: publisher.calls)
        append(fs, xid_line("0000:44:00", 48))
        await until(lambda: HealthReport.parse(publisher.calls[-1]).state == "unhealthy")
        source.seen = asked()
        await until(lambda: HealthReport.parse(publisher.calls[-1]).answered == "reset-gpu:0:100")
        source.seen = Seen()  # the operator withdrew it
        await asyncio.sleep(0.05)
        stop.set()
        await task

    asyncio.run(scenario())
    reports = [HealthReport.parse(t) for t in publisher.calls]
    assert [r.state for r in reports[:3]] == ["healthy", "unhealthy", "healthy"]
    assert reports[2].answered == "reset-gpu:0:100" and resets.calls == [BUS]
    assert reports[-1].stopped


def test_nvidia_smi_is_run_through_the_driver_root(build_host: Any) -> None:
    fs: HostFS = build_host("operator-driver").fs

    class Runner:
        def __init__(self) -> None:
            self.calls: list[tuple[list[str], str | None]] = []

        def run(
            self, argv: list[str], *, root: str | None = "/", timeout: float = 60.0, env: Any = None
        ) -> CommandResult:
            self.calls.append((list(argv), root))
            return CommandResult(tuple(argv), 0)

    runner = Runner()
    ok, why = smi_resetter(fs, runner)(BUS)
    assert (ok, why) == (True, f"`{runner.calls[-1][0][0]} -r -i {BUS}` exited 0")  # persistence mode was off
    argv, root = runner.calls[-1]
    assert argv[1:] == ["-r", "-i", BUS] and root == "/run/nvidia/driver" and argv[0].endswith("/nvidia-smi")


def test_persistence_mode_is_turned_off_for_the_reset_and_back_on(build_host: Any) -> None:
    fs: HostFS = build_host("operator-driver").fs

    class Runner:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def run(
            self, argv: list[str], *, root: str | None = "/", timeout: float = 60.0, env: Any = None
        ) -> CommandResult:
            self.calls.append(list(argv[1:]))
            out = "Enabled\n" if "--query-gpu=persistence_mode" in argv else ""
            return CommandResult(tuple(argv), 0, stdout=out)

    runner = Runner()
    ok, _ = smi_resetter(fs, runner)(BUS)
    assert ok and runner.calls == [
        ["-i", BUS, "--query-gpu=persistence_mode", "--format=csv,noheader"],
        ["-i", BUS, "-pm", "0"],
        ["-r", "-i", BUS],
        ["-i", BUS, "-pm", "1"],
    ]


def test_no_nvidia_smi_fails_the_reset_naming_it(build_host: Any) -> None:
    fs: HostFS = build_host("cpu-only").fs
    ok, why = smi_resetter(fs, object())(BUS)
    assert not ok and why == "nvidia-smi not found on the host or in the driver root"


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
    assert agent.act(Seen()) is False and looks == []
    assert agent.act(asked("reboot")) is True and looks == []
    assert fs.exists(SENTINEL)
    agent.act(asked(attempt=1, since="200"))
    assert looks == [1]


def test_the_report_says_when_validation_passed_and_a_new_validation_moves_it(build_host: Any) -> None:
    """validatedAt: the newest expected status file's mtime, which the operator compares with the
    time of its action (only a validation newer than the action releases the node)."""
    import os

    from gpu_operator.node.validate.config import STATUS_FILES
    from gpu_operator.vocabulary import HEALTH_VALIDATIONS, VALIDATIONS_DIR

    fs = make_host(build_host)
    for i, name in enumerate(HEALTH_VALIDATIONS):
        os.utime(fs.resolve(f"{VALIDATIONS_DIR}/{STATUS_FILES[name]}"), (1000.0 + i, 1000.0 + i))
    agent = agent_with(fs, Resets())
    assert report_of(agent).validatedAt == 1000.0 + len(HEALTH_VALIDATIONS) - 1
    os.utime(fs.resolve(f"{VALIDATIONS_DIR}/{STATUS_FILES['cuda']}"), (2000.5, 2000.5))  # the validator again
    assert report_of(agent).validatedAt == 2000.5
    fs.remove(f"{VALIDATIONS_DIR}/{STATUS_FILES['cuda']}")
    report = report_of(agent)
    assert not report.validated and report.validatedAt is None
