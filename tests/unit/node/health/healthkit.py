"""Shared helpers of the health agent's tests on host trees (tests/fixtures/hosts): kernel log
records and Xid lines, the validator's status files, an agent and its steps, a publisher and NVML
stand-in, and what the agent sees when the operator asks for a remediation."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_operator.api.health import HealthReport
from gpu_operator.controllers.units.health.machine import request_text
from gpu_operator.node.health import HealthAgent, encode
from gpu_operator.node.health.requests import RequestActor, Seen
from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.vocabulary import (
    HEALTH_ATTEMPTS_ANNOTATION,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
    VALIDATIONS_DIR,
)

GPUS = [
    "0000:0a:00.0",
    "0000:18:00.0",
    "0000:3b:00.0",
    "0000:44:00.0",
    "0000:87:00.0",
    "0000:90:00.0",
    "0000:b8:00.0",
    "0000:c1:00.0",
]
SEQ = iter(range(10_000, 1_000_000))


def record(message: str) -> str:
    """One /dev/kmsg record (`prio,seq,usec,flags;message`) and a continuation line, as the kernel writes them."""
    seq = next(SEQ)
    return f"3,{seq},{seq * 1000},-;{message}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:0a:00.0\n"


def xid_line(bus: str, xid: int) -> str:
    return record(f"NVRM: Xid (PCI:{bus}): {xid}, pid=4242, name=python, something happened")


def append(fs: HostFS, text: str) -> None:
    with fs.resolve("/dev/kmsg").open("a") as handle:
        handle.write(text)


def validated(fs: HostFS, components: tuple[str, ...] = ("driver", "toolkit", "cuda", "plugin")) -> None:
    for component in components:
        fs.write_text(f"{VALIDATIONS_DIR}/{component}-ready", "")


def agent_for(fs: HostFS, **kwargs: Any) -> HealthAgent:
    logs: list[str] = []
    kwargs.setdefault("nvml", False)
    agent = HealthAgent(fs, "node-a", log=logs.append, **kwargs)
    agent.logs = logs  # type: ignore[attr-defined]
    return agent


def step(agent: HealthAgent) -> dict[str, Any] | None:
    return asyncio.run(agent.step())


def gpu(report: dict[str, Any], bus: str) -> dict[str, Any]:
    listed: dict[str, dict[str, Any]] = {g["bus"]: g for g in report["gpus"]}
    assert bus in listed, f"{bus} not listed: {report}"
    return listed[bus]


class FakePublisher:
    def __init__(self) -> None:
        self.texts: list[str] = []

    async def publish(self, text: str, withdraw: tuple[str, ...] = ()) -> None:
        self.texts.append(text)


class FakeNvml:
    """The part of pynvml the agent calls, with events and errors a test queues."""

    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeDoubleBitEccError = 0x2
    NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED = 10, 15, 16
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, buses: list[str]) -> None:
        self.buses = buses
        self.queue: list[tuple[int, int, int]] = []  # (index, type, data)
        self.lost: set[int] = set()
        self.lost_at_start: set[int] = set()
        self.registered: dict[int, int] = {}

    def nvmlInit(self) -> None: ...  # noqa: N802
    def nvmlShutdown(self) -> None: ...  # noqa: N802
    def nvmlEventSetCreate(self) -> str:
        return "set"  # noqa: N802

    def nvmlEventSetFree(self, _: str) -> None: ...  # noqa: N802
    def nvmlDeviceGetCount(self) -> int:
        return len(self.buses)  # noqa: N802

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        if i in self.lost_at_start:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h  # noqa: N802

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return 0xFF  # noqa: N802

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, _: str) -> None:  # noqa: N802
        self.registered[h] = mask

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:  # noqa: N802
        class Info:
            busId = f"0000{self.buses[h]}".upper().encode()  # NVML's 8-digit domain, bytes  # noqa: N815

        return Info()

    def nvmlEventSetWait_v2(self, _: str, timeout: int) -> Any:  # noqa: N802
        if not self.queue:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        index, kind, data = self.queue.pop(0)

        class Event:
            device, eventType, eventData = index, kind, data  # noqa: N815

        return Event()

    def nvmlDeviceGetTemperature(self, h: int, _: int) -> int:  # noqa: N802
        if h in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return 40

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:  # noqa: N802
        return (0, 0, 1 if h == 5 else 0, 0)


BUS = "0000:44:00.0"  # minor 3 on the fixture host
OTHER = "0000:c1:00.0"  # minor 7
AGENT_PID = 4242  # the agent's PID as the host numbers it (its container's PID namespace calls it 1)


def asked(
    action: str = "reset-gpu",
    gpus: list[str] | None = None,
    *,
    attempt: int = 0,
    since: str = "100",
    node: str = "node-a",
    state: str = "validating",
    remediation: bool = True,
    notes: dict[str, str] | None = None,
) -> Seen:
    """What the agent sees when the operator asks: its Node in the attempt, its entry in the Secret."""
    text = request_text(
        node, action, gpus if gpus is not None else ([BUS] if action == "reset-gpu" else []), attempt, since
    )
    if not remediation:
        text = text.replace('"remediation":true', '"remediation":false')
    annotations = {
        HEALTH_SINCE_ANNOTATION: since,
        **({HEALTH_ATTEMPTS_ANNOTATION: str(attempt)} if attempt else {}),
        **(notes or {}),
    }
    return Seen({HEALTH_STATE: state}, annotations, text)


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
    # the host's /proc/self as this agent reads it through the host root: the host's numbering first
    fs.write_text("/proc/self/status", f"Name:\tgpu-operator\nPid:\t{AGENT_PID}\nNSpid:\t{AGENT_PID}\t1\n")
    validated(fs)
    return fs


def agent_with(fs: HostFS, resets: Resets) -> HealthAgent:
    logs: list[str] = []
    actor = RequestActor(fs, resets, log=logs.append)
    agent = HealthAgent(fs, "node-a", nvml=False, log=logs.append, requests=actor)
    agent.logs = logs  # type: ignore[attr-defined]
    return agent


def report_of(agent: HealthAgent) -> HealthReport:
    return HealthReport.parse(encode(agent.observe()))
