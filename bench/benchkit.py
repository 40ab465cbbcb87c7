"""Measuring helpers for the scale benchmark: /proc readings, audit-log and metrics counts, nodes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType
from prometheus_client.parser import text_string_to_metric_families

from gpu_operator.sim.plane.auditlog import AuditReader
from gpu_operator.vocabulary import DRA_STATE_LABELS, GPU_PRESENT, STATE_LABELS

# A node counts as labelled once it carries every deploy label of the container workload (with a
# GPUCluster: of the DRA stack).
WANTED = (GPU_PRESENT, *STATE_LABELS["container"])
DRA_WANTED = (GPU_PRESENT, *DRA_STATE_LABELS)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def stop_on_sigterm() -> None:
    """SIGTERM unwinds as Ctrl-C does (SystemExit 143 through every `finally`), so that a bench
    stopped by `kill` or `timeout` stops the control plane and operators it started (they run in
    sessions of their own and outlive a bench killed outright)."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def labelled(labels: dict[str, str] | None, wanted: tuple[str, ...] = WANTED) -> bool:
    return bool(labels) and all((labels or {}).get(key) == "true" for key in wanted)


@dataclass
class ProcStats:
    rss_peak_mb: float
    rss_mb: float
    cpu_seconds: float


def proc_stats(pid: int) -> ProcStats:
    """Peak and current RSS (VmHWM, VmRSS) and user+system CPU seconds of a live process."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return ProcStats(
        rss_peak_mb=int(status["VmHWM"].split()[0]) / 1024,
        rss_mb=int(status["VmRSS"].split()[0]) / 1024,
        cpu_seconds=(int(fields[11]) + int(fields[12])) / CLK_TCK,
    )


def _metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def metric_sum(port: int, name: str) -> float:
    """The sum of every sample of a Prometheus counter on the operator's /metrics."""
    text = _metrics_text(port)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def histogram(port: int, name: str) -> dict[float, float]:
    """A Prometheus histogram on the operator's /metrics as {upper bound: cumulative count}."""
    for family in text_string_to_metric_families(_metrics_text(port)):
        if family.name == name:
            return {float(s.labels["le"]): s.value for s in family.samples if s.name == name + "_bucket"}
    return {}


def counter_by(port: int, name: str, label: str) -> dict[str, float]:
    """A labelled Prometheus counter on the operator's /metrics as {label value: count} (summed over its other labels)."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(_metrics_text(port)):
        if family.name == name:
            for sample in family.samples:
                if sample.name == name + "_total":
                    key = sample.labels.get(label, "")
                    counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding the q-quantile (0..1) of what was observed between
    two reads of one histogram (inf: above the largest bound); None when nothing was observed."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    if total <= 0:
        return None
    return next(le for le, n in counts.items() if n >= q * total)


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def completed(reader: AuditReader) -> Iterator[dict[str, Any]]:
    """The audit events (ResponseComplete stage) from the reader's place on, across the
    apiserver's rotations of the log, each decoded once."""
    for raw in reader.lines():
        try:
            event = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if event.get("stage") == "ResponseComplete":
            yield event


def audit_writes(events: Iterable[dict[str, Any]], user: str) -> tuple[int, dict[str, int]]:
    """Write requests by `user` among `events` (`completed`), leases excluded (leader election
    renews its Lease by design); reads (the audit policy logs them too: the apiserver probe,
    read-backs) are left out. Returns (count, {"verb resource": count})."""
    counts: Counter[str] = Counter()
    for event in events:
        if event.get("user", {}).get("username") != user:
            continue
        ref = event.get("objectRef") or {}
        if ref.get("apiGroup") == "coordination.k8s.io" or event.get("verb") not in WRITE_VERBS:
            continue
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        counts[f"{event.get('verb')} {ref.get('resource', '?')}{sub}"] += 1
    return sum(counts.values()), dict(counts)


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def join_phases(
    events: Iterable[dict[str, Any]], latencies: dict[str, float], user: str
) -> dict[str, list[float]]:
    """Where each join's time went, from the apiserver's audit events (`completed`; their
    timestamps, microseconds):
    `create` the node's create request (received -> answered), `to_patch` from that answer to
    the arrival of `user`'s first patch of the node (the watch event reaching the operator, its
    own delay, the request's way in), `patch` that patch (received -> answered), `rest` what is
    left of the join's measured latency (the bench's watch seeing the labels, and the way of
    the create request in and out). Joins without both requests in the log are left out."""
    created: dict[str, tuple[float, float]] = {}
    patched: dict[str, tuple[float, float]] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        name = ref.get("name")
        if ref.get("resource") != "nodes" or name not in latencies:
            continue
        times = (_stamp(event["requestReceivedTimestamp"]), _stamp(event["stageTimestamp"]))
        if event.get("verb") == "create":
            created[name] = times
        elif event.get("verb") == "patch" and event.get("user", {}).get("username") == user:
            patched.setdefault(name, times)
    phases: dict[str, list[float]] = {"create": [], "to_patch": [], "patch": [], "rest": []}
    for name, latency in latencies.items():
        if name not in created or name not in patched or latency == float("inf"):
            continue
        (c0, c1), (p0, p1) = created[name], patched[name]
        for key, value in (
            ("create", c1 - c0),
            ("to_patch", p0 - c1),
            ("patch", p1 - p0),
            ("rest", latency - (p1 - c0)),
        ):
            phases[key].append(value)
    return phases


async def watch_nodes(client: AsyncClient, see: Callable[[Node], None]) -> None:
    """Every Node event to `see`, forever: a watch that ends or fails is started again."""
    while True:
        try:
            async for _, node in client.watch(Node, server_timeout=60):
                see(node)
        except Exception:  # noqa: BLE001 - restart the watch
            await asyncio.sleep(0.5)


async def create_nodes(client: AsyncClient, manifests: Iterable[dict[str, Any]], concurrency: int) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(manifest: dict[str, Any]) -> None:
        async with limit:
            try:
                await client.create(from_dict(manifest))
            except ApiError as err:
                if err.status.code != 409:
                    raise

    await asyncio.gather(*(one(m) for m in manifests))


async def patch_ceiling(client: AsyncClient, names: list[str], total: int, concurrency: int) -> float:
    """Node-label merge patches per second the apiserver accepts from a tight client with
    `concurrency` requests in flight (the same patch type and concurrency as the operator's)."""
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limit:
            await client.patch(
                Node,
                names[i % len(names)],
                {"metadata": {"labels": {"bench.gpu-operator/ceiling": str(i)}}},
                patch_type=PatchType.MERGE,
            )

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(total)))
    return total / (time.monotonic() - start)


@dataclass
class LabelWatch:
    """Records, from a Node watch, when each node first carried every wanted label. `started` is
    set once the watch has delivered its initial events for the `existing` nodes: until then a
    label change waits behind them in the stream (at 5,000 nodes, seconds of decoding), which a
    measurement started earlier would count as the operator's time."""

    client: AsyncClient
    wanted: tuple[str, ...] = WANTED
    existing: int = 0
    labelled_at: dict[str, float] = field(default_factory=dict)
    waiters: dict[str, asyncio.Event] = field(default_factory=dict)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    seen: set[str] = field(default_factory=set)

    async def run(self) -> None:
        while True:  # a watch may end (server timeout): resume
            try:
                async for _op, node in self.client.watch(Node):
                    if not self.started.is_set() and node.metadata is not None and node.metadata.name:
                        self.seen.add(node.metadata.name)
                        if len(self.seen) >= self.existing:
                            self.started.set()
                    self._see(node)
            except (ApiError, OSError):
                await asyncio.sleep(0.2)

    def _see(self, node: Any) -> None:
        name = node.metadata.name
        if name not in self.labelled_at and labelled(node.metadata.labels, self.wanted):
            self.labelled_at[name] = time.monotonic()
            if name in self.waiters:
                self.waiters[name].set()

    def waiter(self, name: str) -> asyncio.Event:
        event = self.waiters.setdefault(name, asyncio.Event())
        if name in self.labelled_at:
            event.set()
        return event

    async def wait_all(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(n in self.labelled_at for n in names):
                return True
            await asyncio.sleep(0.05)
        return False


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


_REQUEST_LINE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def apiserver_requests(server: str, context: ssl.SSLContext) -> Counter[str]:
    """The apiserver's request counters (`apiserver_request_total`) summed by "VERB resource[/sub]"."""
    req = urllib.request.Request(f"{server}/metrics")
    with urllib.request.urlopen(req, context=context, timeout=30) as resp:
        text = resp.read().decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        match = _REQUEST_LINE.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
        counts[f"{labels.get('verb', '?')} {labels.get('resource', '?')}{sub}"] += int(float(match["value"]))
    return counts


def cpu_seconds(pid: int) -> float:
    try:
        return proc_stats(pid).cpu_seconds
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


async def simulator_load(
    server: str, context: ssl.SSLContext, pids: dict[str, int], seconds: float
) -> dict[str, Any]:
    """What the simulated cluster costs by itself over a window with no operator: apiserver
    requests/s by verb and resource (kwok's Lease renewals and node status, the controllers'
    reads) and each component's CPU as a fraction of one core."""
    before, cpu0, t0 = (
        apiserver_requests(server, context),
        {n: cpu_seconds(p) for n, p in pids.items()},
        time.monotonic(),
    )
    await asyncio.sleep(seconds)
    after, cpu1 = apiserver_requests(server, context), {n: cpu_seconds(p) for n, p in pids.items()}
    elapsed = time.monotonic() - t0
    rates = {
        k: round((after[k] - before.get(k, 0)) / elapsed, 2) for k in after if after[k] > before.get(k, 0)
    }
    writes = sum(v for k, v in rates.items() if k.split()[0] in ("PUT", "PATCH", "POST", "DELETE", "APPLY"))
    return {
        "window_s": round(elapsed, 1),
        "requests_per_s": dict(sorted(rates.items(), key=lambda kv: -kv[1])),
        "writes_per_s": round(writes, 1),
        "reads_per_s": round(sum(rates.values()) - writes, 1),
        "cpu_cores": {n: round((cpu1[n] - cpu0[n]) / elapsed, 3) for n in pids},
    }


def unready_census(pods: Iterable[Any], nodes: Iterable[Any] = ()) -> dict[str, int]:
    """Operand pods that are not Ready, counted by DaemonSet and what their status says: the phase,
    the Ready and ContainersReady conditions, how many pod IPs they carry (a stage of kwok's refused
    by the apiserver leaves its mark there) and their node's Ready condition, so that a stalled
    rollout says which operands stall and how."""
    node_ready = {
        node.metadata.name: next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "-")
        for node in nodes
        if node.status is not None
    }
    census: Counter[str] = Counter()
    for pod in pods:
        status = pod.status
        conditions = {c.type: c.status for c in (status.conditions or [])} if status else {}
        if conditions.get("Ready") == "True":
            continue
        owner = next((o.name for o in pod.metadata.ownerReferences or [] if o.controller), "-")
        phase = (status.phase if status else None) or "-"
        ips = len(status.podIPs or []) if status else 0
        ready = f"ready={conditions.get('Ready', '-')} containers={conditions.get('ContainersReady', '-')}"
        node = node_ready.get(pod.spec.nodeName, "-") if pod.spec else "-"
        census[f"{owner} phase={phase} {ready} ips={ips} node-ready={node}"] += 1
    return dict(census.most_common())


def component_cpu(plane: Any, operator_pid: int) -> dict[str, float]:
    """CPU seconds so far of each simulator process, the operator and this process (the bench and
    the stand-ins' thread): what the simulator costs beside the operator it measures."""
    pids = {
        c.name: c.process.pid for c in plane.components if c.process is not None and c.process.poll() is None
    }
    pids |= {"operator": operator_pid, "bench + stand-ins": os.getpid()}
    return {name: proc_stats(p).cpu_seconds for name, p in pids.items()}


def feature_gates(text: str) -> dict[str, bool]:
    """`--feature-gates` as the control plane takes them: `A=false,B=true` -> {A: False, B: True}."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if value.lower() not in ("true", "false"):
            raise SystemExit(f"--feature-gates: {item!r} is not NAME=true or NAME=false")
        gates[name] = value.lower() == "true"
    return gates


async def write_tail(
    log: Path, user: str, *, quiet: float, limit: float
) -> tuple[float, int, dict[str, int]]:
    """Wait until `user` (the operator) has written nothing for `quiet` seconds, at most `limit`
    seconds: after the policy is ready the node components' stand-ins still act on the last nodes
    (GFD's NodeFeatures, the MIG manager's state) and the operator answers each once, so an idle
    window opened at once would count the rollout's tail. Returns (seconds until its last write,
    its writes meanwhile, by verb and resource)."""
    reader, start = AuditReader.from_now(log), time.monotonic()
    last, total, kinds = start, 0, Counter[str]()
    while time.monotonic() - last < quiet and time.monotonic() - start < limit:
        await asyncio.sleep(min(5.0, quiet))
        count, by_kind = audit_writes(completed(reader), user)
        if count:
            last, total = time.monotonic(), total + count
            kinds.update(by_kind)
    return last - start, total, dict(kinds)
