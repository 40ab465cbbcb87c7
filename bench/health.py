"""The scale benchmark's GPU health phase (`--health-faults PERCENT`): after the idle window, the
driver's Xid 79 record is written into the kernel log of PERCENT % of the nodes (their host trees,
as `gpu-operator sim fault NODE --xid 79` does: `sim/commands/faultinject.py`), then every fault is
cleared (`--clear`, a reboot of the tree). One Node watch of the bench's own records, per faulted
node:

- `agent`: the Xid written (after the kernel-log append returned) -> the report annotation
  nvidia.com/gpu-health.report naming a GPU unhealthy. The simulator plays our agent on kwok
  nodes (`sim/standins/health.py`): it looks at the trees' change journal every 2 s, so this includes up
  to 2 s of that poll; a real agent's /dev/kmsg read is not measured here;
- `signals`: that report seen -> both the condition NvidiaGPUReady=False and the taint
  nvidia.com/gpu-unhealthy seen on the Node (the operator's part);
- `clear`: the reboot written -> the condition True and the taint gone (the stand-in's new agent
  publishes a healthy report, then the operator lifts both); `clear_report` its first part.

The phase first waits (`--health-wait`) until every node's report is healthy, its condition
True and no taint on it (the validator pods' rollout done); faulted nodes are chosen among those,
spread over the node names. Over the whole phase (first Xid to the last
node cleared): the operator's writes (apiserver audit log, its ServiceAccount, Leases excluded)
to nodes not faulted, split by whether that node's report changed during the phase (its
validator pod still starting: the rollout, not the fault) or not (healthy and unchanged: the
figure expected to be 0); the operator's CPU seconds; its peak RSS (VmHWM: the process's peak
since it started, so the phase's only if the phase raised it).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import audit_writes, completed, percentile, proc_stats
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from gpu_operator.api.health import HealthReport, ReportError
from gpu_operator.sim.hardware.faults import XID_OFF_BUS, NodeHosts, node_host_spec
from gpu_operator.sim.plane.auditlog import AuditReader
from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_REPORT_ANNOTATION, HEALTH_TAINT

# issue 43 item 7
TARGETS = {"signals_p99_s": 2.0, "agent_p99_s": 5.0, "healthy_writes": 0, "rss_mb": 150.0}
SHAPE_OF = "dgx-h100"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--health-faults",
        type=float,
        default=0.0,
        metavar="PERCENT",
        help="after the idle window: an Xid 79 on PERCENT %% of the nodes, then --clear "
        "(bench/health.py); 0: skip",
    )
    parser.add_argument(
        "--health-wait",
        type=float,
        default=300.0,
        help="max wait for every node to be healthy (report, condition True) before the faults; then at "
        "least PERCENT %% must be",
    )
    parser.add_argument(
        "--health-timeout",
        type=float,
        default=120.0,
        help="max wait for the faulted nodes' condition and taint (and again after --clear)",
    )


@dataclass
class Seen:
    """A node as the watch last saw it, and when its health fields changed."""

    report: str | None = None
    unhealthy: bool = False
    healthy: bool = False
    condition: str | None = None
    tainted: bool = False
    changed_report_at: float | None = None


@dataclass
class HealthWatch:
    """Node watch: each node's report, condition and taint, and when they first met a wish."""

    client: AsyncClient
    existing: int
    nodes: dict[str, Seen] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    wishes: dict[str, list[tuple[str, asyncio.Future[float]]]] = field(default_factory=dict)
    parsed: dict[str, tuple[bool, bool]] = field(default_factory=dict)

    async def run(self) -> None:
        while True:  # a watch may end (server timeout): resume
            try:
                async for _op, node in self.client.watch(Node):
                    self._see(node)
            except (ApiError, OSError):
                await asyncio.sleep(0.2)

    def _judge(self, text: str | None) -> tuple[bool, bool]:
        """(names a GPU unhealthy or gone, healthy and validated) for a report's text."""
        if text is None:
            return False, False
        if text not in self.parsed:
            try:
                report = HealthReport.parse(text)
                self.parsed[text] = (bool(report.unhealthy), report.ready and report.state == "healthy")
            except ReportError:
                self.parsed[text] = (False, False)
        return self.parsed[text]

    def _see(self, node: Node) -> None:
        now = time.monotonic()
        meta = node.metadata
        if meta is None or not meta.name:
            return
        seen = self.nodes.setdefault(meta.name, Seen())
        text = (meta.annotations or {}).get(HEALTH_REPORT_ANNOTATION)
        if text != seen.report and self.started.is_set():
            seen.changed_report_at = now
        seen.report = text
        seen.unhealthy, seen.healthy = self._judge(text)
        conditions = (node.status.conditions if node.status else None) or []
        seen.condition = next((c.status for c in conditions if c.type == HEALTH_CONDITION), None)
        seen.tainted = any(t.key == HEALTH_TAINT for t in (node.spec.taints if node.spec else None) or [])
        if not self.started.is_set() and len(self.nodes) >= self.existing:
            self.started.set()
        for wish, future in list(self.wishes.get(meta.name, [])):
            if not future.done() and WISHES[wish](seen):
                future.set_result(now)
                self.wishes[meta.name].remove((wish, future))

    def wish(self, name: str, wish: str) -> asyncio.Future[float]:
        """A future set to the monotonic time the watch first sees `name` meet `wish` (from now on)."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.wishes.setdefault(name, []).append((wish, future))
        return future

    def candidates(self, names: list[str]) -> list[str]:
        return [
            n
            for n in names
            if (s := self.nodes.get(n)) is not None and s.healthy and s.condition == "True" and not s.tainted
        ]


WISHES: dict[str, Callable[[Seen], bool]] = {
    "report_unhealthy": lambda s: s.unhealthy,
    "signals": lambda s: s.condition == "False" and s.tainted,
    "report_healthy": lambda s: s.healthy,
    "cleared": lambda s: s.condition == "True" and not s.tainted,
}


def spread(names: list[str], k: int) -> list[str]:
    """k of `names`, evenly spaced."""
    step = len(names) / k
    return [names[int(i * step)] for i in range(k)]


async def timed(future: asyncio.Future[float], timeout: float) -> float | None:
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        return None


def figures(out: dict[str, Any], key: str, values: list[float | None]) -> None:
    done = [v for v in values if v is not None]
    out[f"health_{key}_missing"] = len(values) - len(done)
    for q in (50, 99):
        out[f"health_{key}_p{q}_s"] = percentile(done, q) if done else None
    out[f"health_{key}_max_s"] = max(done) if done else None


async def health_phase(
    client: AsyncClient,
    names: list[str],
    percent: float,
    hosts: Path,
    pid: int,
    audit_log: Path,
    user: str,
    args: argparse.Namespace,
    say: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {"health_percent": percent}
    k = max(1, math.ceil(len(names) * percent / 100))
    watch = HealthWatch(client, existing=len(names))
    watcher = asyncio.create_task(watch.run())
    try:
        # the first list of every Node is decoded in this process beside the stand-ins (one agent and
        # one client per validator pod): at 5,000 nodes that took more than 80 s on 2 cores (2026-12-02)
        await asyncio.wait_for(watch.started.wait(), 60 + len(names) / 10)
        t = time.monotonic()
        # every node healthy (the reports of the rollout written), or --health-wait: then at least k
        while len(watch.candidates(names)) < len(names) and time.monotonic() - t < args.health_wait:
            await asyncio.sleep(2)
        ready = watch.candidates(names)
        out["health_wait_s"] = time.monotonic() - t
        out["health_nodes_with_report"] = sum(1 for n in names if (s := watch.nodes.get(n)) and s.report)
        out["health_nodes_ready"] = len(ready)
        say(
            f"health: {len(ready)} of {len(names)} nodes healthy (report, condition True, no taint), "
            f"{out['health_nodes_with_report']} with a report, after {out['health_wait_s']:.0f}s"
        )
        if len(ready) < k:
            out["health_error"] = f"only {len(ready)} healthy nodes to fault, {k} wanted"
            return out
        faulted = spread(ready, k)
        out["health_faulted"] = k
        node_hosts = NodeHosts(hosts)
        audit = AuditReader.from_now(audit_log)
        cpu0, t0 = proc_stats(pid).cpu_seconds, time.monotonic()
        out["health_rss_at_start_mb"] = proc_stats(pid).rss_mb

        def inject(name: str) -> float:
            node_hosts.faults(name, node_host_spec(SHAPE_OF)).xid(
                XID_OFF_BUS, 0
            )  # as `sim fault NAME --xid 79`
            at = time.monotonic()
            node_hosts.announce(name)
            return at

        reports = {n: watch.wish(n, "report_unhealthy") for n in faulted}
        signals = {n: watch.wish(n, "signals") for n in faulted}
        written = {n: await asyncio.to_thread(inject, n) for n in faulted}
        out["health_inject_s"] = time.monotonic() - t0
        seen_report = {
            n: await timed(reports[n], max(1.0, args.health_timeout - (time.monotonic() - t0)))
            for n in faulted
        }
        seen_signals = {
            n: await timed(signals[n], max(1.0, args.health_timeout - (time.monotonic() - t0)))
            for n in faulted
        }
        figures(
            out,
            "agent",
            [
                None if seen_report[n] is None else seen_report[n] - written[n]  # type: ignore[operator]
                for n in faulted
            ],
        )
        figures(
            out,
            "signals",
            [
                None
                if seen_report[n] is None or seen_signals[n] is None
                else max(0.0, seen_signals[n] - seen_report[n])
                for n in faulted
            ],
        )  # type: ignore[operator]
        out["health_fault_cpu_s"] = proc_stats(pid).cpu_seconds - cpu0
        say(
            f"health: Xid 79 on {k} nodes; agent p50/p99 {out['health_agent_p50_s']}/{out['health_agent_p99_s']} s; "
            f"report -> condition+taint p50/p99 {out['health_signals_p50_s']}/{out['health_signals_p99_s']} s "
            f"(missing {out['health_signals_missing']})"
        )

        await asyncio.sleep(2)  # let the last writes land
        cpu1, t1 = proc_stats(pid).cpu_seconds, time.monotonic()
        healthy_again = {n: watch.wish(n, "report_healthy") for n in faulted}
        cleared = {n: watch.wish(n, "cleared") for n in faulted}

        def reboot(name: str) -> float:
            node_hosts.faults(name).clear()  # as `sim fault NAME --clear`
            at = time.monotonic()
            node_hosts.announce(name)
            return at

        rebooted = {n: await asyncio.to_thread(reboot, n) for n in faulted}
        seen_ok = {
            n: await timed(healthy_again[n], max(1.0, args.health_timeout - (time.monotonic() - t1)))
            for n in faulted
        }
        seen_cleared = {
            n: await timed(cleared[n], max(1.0, args.health_timeout - (time.monotonic() - t1)))
            for n in faulted
        }
        figures(
            out,
            "clear_report",
            [
                None if seen_ok[n] is None else seen_ok[n] - rebooted[n]  # type: ignore[operator]
                for n in faulted
            ],
        )
        figures(
            out,
            "clear",
            [
                None if seen_cleared[n] is None else seen_cleared[n] - rebooted[n]  # type: ignore[operator]
                for n in faulted
            ],
        )
        await asyncio.sleep(2)
        stats = proc_stats(pid)
        out["health_clear_cpu_s"] = stats.cpu_seconds - cpu1
        out["health_cpu_s"] = stats.cpu_seconds - cpu0
        out["health_phase_s"] = time.monotonic() - t0
        out["health_rss_peak_mb"], out["health_rss_end_mb"] = stats.rss_peak_mb, stats.rss_mb
        say(
            f"health: --clear: report healthy p50/p99 {out['health_clear_report_p50_s']}/"
            f"{out['health_clear_report_p99_s']} s; condition True, taint gone p50/p99 {out['health_clear_p50_s']}/"
            f"{out['health_clear_p99_s']} s (missing {out['health_clear_missing']})"
        )

        events = list(completed(audit))
        out["health_writes"], out["health_writes_by_kind"] = audit_writes(events, user)
        hit = set(faulted)
        rollout = {
            n
            for n, s in watch.nodes.items()  # report changed during the phase, not before it
            if n not in hit and s.changed_report_at is not None and s.changed_report_at >= t0
        }
        quiet: list[dict[str, Any]] = []
        busy: list[dict[str, Any]] = []
        for event in events:
            ref = event.get("objectRef") or {}
            if ref.get("resource") == "nodes" and ref.get("name") not in hit:
                (busy if ref.get("name") in rollout else quiet).append(event)
        out["health_healthy_writes"], out["health_healthy_writes_by_kind"] = audit_writes(quiet, user)
        out["health_rollout_writes"], out["health_rollout_writes_by_kind"] = audit_writes(busy, user)
        out["health_rollout_nodes"] = len(rollout)
        say(
            f"health: {out['health_cpu_s']:.1f} s CPU over {out['health_phase_s']:.0f} s; peak RSS "
            f"{stats.rss_peak_mb:.0f} MB; writes to healthy unchanged nodes {out['health_healthy_writes']} "
            f"{out['health_healthy_writes_by_kind']}; to {len(rollout)} nodes whose report changed (rollout) "
            f"{out['health_rollout_writes']}; all {out['health_writes']} {out['health_writes_by_kind']}"
        )
        out["health_targets_met"] = {
            "signals_p99": out["health_signals_missing"] == 0
            and out["health_signals_p99_s"] <= TARGETS["signals_p99_s"],
            "agent_p99": out["health_agent_missing"] == 0
            and out["health_agent_p99_s"] <= TARGETS["agent_p99_s"],
            "healthy_writes": out["health_healthy_writes"] == TARGETS["healthy_writes"],
            "rss": stats.rss_peak_mb <= TARGETS["rss_mb"],
        }
        return out
    finally:
        watcher.cancel()
