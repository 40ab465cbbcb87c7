"""The health agent: observations of one host, the report when it changes, the metrics, the loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpu_operator.node.health import inventory
from gpu_operator.node.health.assess import XidMark, encode, evaluate
from gpu_operator.node.health.catalogue import HEALTHY, STATES, WARNING, classify
from gpu_operator.node.health.kmsg import KmsgFollower, XidEvent
from gpu_operator.node.health.nvml import NvmlSource
from gpu_operator.node.health.observe import HostSnapshot, pci_gpus, snapshot
from gpu_operator.node.health.requests import RequestActor, Seen
from gpu_operator.node.health.xidlines import KernelXids
from gpu_operator.node.host.hostfs import HostFS, HostPathError
from gpu_operator.vocabulary import (
    HEALTH_REPORT_ANNOTATION,
    HEALTH_VALIDATIONS,
    VALIDATIONS_DIR,
)

DEFAULT_WARNING_HOLD = 600.0  # seconds a warning (restart-app, unknown Xid) stays without a new one


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class HealthMetrics:
    """Prometheus metrics of one agent: per GPU its state (one series per state, 1 for the current),
    the node's validation, and Xid events counted by code, action and source."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry if registry is not None else CollectorRegistry()
        self.state = Gauge(
            "gpu_operator_gpu_health_state",
            "GPU health state as the node's health agent sees it (1 for the current state)",
            ["gpu", "state"],
            registry=self.registry,
        )
        self.validated = Gauge(
            "gpu_operator_gpu_health_validated",
            "1 when every validator status file of the node is present",
            registry=self.registry,
        )
        self.xids = Counter(
            "gpu_operator_gpu_xid",
            "Xid events seen since the agent started",
            ["gpu", "xid", "action", "source"],
            registry=self.registry,
        )
        self.ignored = Counter(
            "gpu_operator_gpu_xid_lines_ignored",
            "Kernel-log records naming an Xid that "
            "are not the NVIDIA driver's for a GPU of this node (xidlines.py), by reason",
            ["reason"],
            registry=self.registry,
        )

    def update(self, states: dict[str, str], validated: bool) -> None:
        for bus, current in states.items():
            for state in STATES:
                self.state.labels(gpu=bus, state=state).set(1 if state == current else 0)
        self.validated.set(1 if validated else 0)

    def ignored_line(self, reason: str) -> None:
        self.ignored.labels(reason=reason).inc()

    def xid(self, event: XidEvent, action: str) -> None:
        self.xids.labels(gpu=event.bus, xid=str(event.xid), action=action, source=event.source).inc()


class HealthAgent:
    """One host's health agent, callable in-process (the simulator plays it for fake nodes).

    `observe()` reads the host tree (and NVML) and returns the current report; `step()` does the
    same and returns it only when its JSON differs from the last one returned (None otherwise).
    Publishing is the caller's: see `AnnotationPublisher` and `run`.
    """

    def __init__(
        self,
        fs: HostFS,
        node: str,
        *,
        validations: tuple[str, ...] = HEALTH_VALIDATIONS,
        validations_dir: str = VALIDATIONS_DIR,
        nvml: bool = True,
        nvml_module: Any = None,
        warning_hold: float = DEFAULT_WARNING_HOLD,
        replay: bool = False,
        metrics: HealthMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = _stderr,
        requests: RequestActor | None = None,
    ) -> None:
        self.fs, self.node = fs, node
        self.requests, self.nvml_module = requests, nvml_module
        self.validations, self.validations_dir = validations, validations_dir
        self.warning_hold, self.metrics, self.clock, self.log = warning_hold, metrics, clock, log
        # The kernel log from its end (no replay after a restart); `replay`: what it holds now too.
        self.kmsg = KmsgFollower(fs, from_start=replay)
        if self.kmsg.error:
            log(f"kernel log: {self.kmsg.error}: Xid events come from NVML only")
        self.nvml = NvmlSource(log, nvml_module) if nvml else None
        self.pci_kinds: dict[str, bool] = {}  # bus -> is an NVIDIA GPU (observe.pci_gpus)
        self.baseline: HostSnapshot = snapshot(fs, validations, validations_dir, self.pci_kinds)
        # with the GPUs an earlier agent of this boot found: one lost since is gone, not absent
        self.baseline.pci = inventory.remember(fs, self.baseline.pci, log)
        self.marks: dict[str, XidMark] = {}
        self.last: str | None = None
        self.started = time.time()
        # the kernel log's Xid lines that count, and those dropped per reason (xidlines.py)
        self.kernel_xids = KernelXids(log, metrics.ignored_line if metrics else None)

    def _take(self, event: XidEvent) -> None:
        cls = classify(event.xid)
        if self.metrics:
            self.metrics.xid(event, cls.action)
        old = self.marks.get(event.bus)
        if old is None or STATES.index(cls.state) >= STATES.index(old.cls.state):
            self.marks[event.bus] = XidMark(cls, self.clock(), event.source)

    def _expire(self) -> None:
        """A warning (or a harmless Xid) lapses after `warning_hold` seconds without a new one."""
        now = self.clock()
        for bus, mark in list(self.marks.items()):
            if mark.cls.state in (WARNING, HEALTHY) and now - mark.at >= self.warning_hold:
                del self.marks[bus]

    def sources(self) -> list[str]:
        out = ["pci", "proc"]
        if self.kmsg.fd is not None:
            out.append("kmsg")
        if self.nvml is not None and self.nvml.available:
            out.append("nvml")
        return out

    def observe(self) -> dict[str, Any]:
        """Read what is new and return the current report (always)."""
        # This node's GPUs: on the bus at start or now, listed by the driver, known to NVML.
        gpus = {
            *self.baseline.pci,
            *self.baseline.driver_gpus,
            *(b.lower() for b, g in self.pci_kinds.items() if g),
        }
        nvml = self.nvml if self.nvml is not None and self.nvml.available else None
        observation = nvml.poll(gpus) if nvml is not None else None
        # NVML's Xid events first; the kernel log for the GPUs NVML does not watch (xidlines.py).
        for event in self.kernel_xids.take(
            self.kmsg.poll_records(),
            gpus | set(observation.gpus if observation else ()),
            nvml.xid_buses if nvml is not None else (),
        ):
            self._take(event)
        for event in observation.events if observation else []:
            self._take(event)
        self._expire()
        now = snapshot(self.fs, self.validations, self.validations_dir, self.pci_kinds)
        report, states = evaluate(self.baseline, now, self.marks, observation, self.sources())
        if self.metrics:
            self.metrics.update(states, report["validated"])
        if report["validated"]:
            report["validatedAt"] = self.validated_at()
        if self.requests is not None:
            report.update(self.requests.report_fields())
        return report

    def validated_at(self) -> float:
        """When the node's validation passed: the newest of the expected status files' mtimes (the
        validator writes each as its check passes); with none expected, when this agent started
        (its pod's own checks ran first)."""
        from gpu_operator.node.validate.config import STATUS_FILES

        times = []
        for name in self.validations:
            try:
                times.append(self.fs.resolve(f"{self.validations_dir}/{STATUS_FILES[name]}").stat().st_mtime)
            except (OSError, HostPathError):
                continue
        return round(max(times, default=self.started), 3)

    def act(self, seen: Seen) -> bool:
        """Carry out the operator's request for this node, if `seen` admits one (requests.py);
        True when one was carried out in full now. A GPU reset clears its Xid state. NVML's
        handles (open device files, which would hold the GPUs) are let go before a reset."""
        if self.requests is None:
            return False
        request = self.requests.admit(seen, self.node)
        known: set[str] = set()
        gone: set[str] = set()
        if request is not None and request.action == "reset-gpu" and request.id != self.requests.answered:
            self.observe()  # the Xids logged until now: those a reset clears
            now = pci_gpus(self.fs, self.pci_kinds)
            known = set(self.baseline.pci) | set(now)
            gone = set(self.baseline.pci) - set(now)
        released = False

        def release_nvml() -> None:
            nonlocal released
            if self.nvml is not None and self.nvml.available and not released:
                self.nvml.close()
                released = True

        self.requests.before_reset = release_nvml
        try:
            handled = self.requests.act(request, known, gone)
        finally:
            self.requests.before_reset = None
            if released:
                self.nvml = NvmlSource(self.log, self.nvml_module)
        for bus in handled.reset:
            self.marks.pop(bus, None)
        return handled.answered

    async def step(self) -> dict[str, Any] | None:
        """The report when it changed since the last step (the first step always returns one)."""
        report = self.observe()
        text = encode(report)
        if text == self.last:
            return None
        self.last = text
        return report

    def final(self) -> dict[str, Any]:
        """The last report, as the agent stops: marked `stopped` (the operator no longer trusts it)."""
        return {**self.observe(), "stopped": True}

    def close(self) -> None:
        self.kmsg.close()
        if self.nvml is not None:
            self.nvml.close()


class Publisher(Protocol):
    async def publish(self, text: str) -> None: ...


class RequestSource(Protocol):
    def current(self) -> Seen: ...


class AnnotationPublisher:
    """One merge patch of the Node's report annotation per call (the node agents' Kubernetes client)."""

    def __init__(self, node: str, client: Any = None) -> None:
        from gpu_operator.node.cluster.kubeapi import new_client

        self.node = node
        self.client = client if client is not None else new_client()
        self.patches = 0

    def _patch(self, text: str) -> None:
        from gpu_operator.node.cluster.kubeapi import patch_node

        patch_node(self.client, self.node, annotations={HEALTH_REPORT_ANNOTATION: text})
        self.patches += 1

    async def publish(self, text: str) -> None:
        """The report (which also answers the operator's requests: its `answered`)."""
        await asyncio.to_thread(self._patch, text)


async def run(
    agent: HealthAgent,
    publisher: Publisher,
    interval: float,
    stop: asyncio.Event,
    requests: RequestSource | None = None,
) -> None:
    """Step every `interval` seconds and publish each changed report (a failed write is retried at
    the next step, and only then); with `requests` (what the agent sees of its Node and of its
    request), carry out the operator's request first: the report that follows answers it; on
    `stop`, publish the final report and close."""
    pending: str | None = None
    while not stop.is_set():
        if requests is not None:
            await asyncio.to_thread(agent.act, requests.current())
        report = await agent.step()
        if report is not None:
            pending = encode(report)
            agent.log(
                f"report changed: state={report['state']} action={report['action']} "
                f"validated={str(report['validated']).lower()} gpus listed={len(report['gpus'])}"
            )
        if pending is not None:
            try:
                await publisher.publish(pending)
                pending = None
            except Exception as err:  # noqa: BLE001 - the apiserver may be away; retry next step
                agent.log(f"publishing the report failed (retrying in {interval:g}s): {err}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
    try:
        await publisher.publish(encode(agent.final()))
    except Exception as err:  # noqa: BLE001 - best effort on the way out
        agent.log(f"publishing the final report failed: {err}")
    agent.close()


def install_stop(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stop` (the loop ends cleanly)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
