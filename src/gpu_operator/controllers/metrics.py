"""The operator's Prometheus metrics (upstream's names) and its metrics and health endpoints."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.aiohttp import make_aiohttp_handler

from gpu_operator import vocabulary as vocab

if TYPE_CHECKING:
    from gpu_operator.controllers.apply import ReconcileReport

GPU_NODES = Gauge("gpu_operator_gpu_nodes_total", "Nodes with nvidia.com/gpu.present=true")
LEADER = Gauge(
    "gpu_operator_leader",
    "1 while this replica leads (holds the Lease, or runs without leader election), else 0",
)
LAST_SUCCESS = Gauge(
    "gpu_operator_reconciliation_last_success_ts_seconds", "Unix time of the last reconcile that ended ready"
)
STATUS = Gauge(
    "gpu_operator_reconciliation_status",
    "1 ready, 0 operands not ready, -1 ClusterPolicy unavailable, -2 operator error",
)
RECONCILES = Counter("gpu_operator_reconciliation", "Reconciles that reached the state walk")
FAILED = Counter("gpu_operator_reconciliation_failed", "Reconciles that ended not ready or in error")
HAS_NFD = Gauge("gpu_operator_reconciliation_has_nfd_labels", "1 when any node has NFD labels")
AUTO_UPGRADE = Gauge("gpu_operator_driver_auto_upgrade_enabled", "1 when driver auto-upgrade is on")
# Ours (no upstream counterpart): every failed node label patch, by HTTP status code.
LABEL_PATCH_FAILURES = Counter(
    "gpu_operator_node_label_patch_failures", "Node label patches that failed, by HTTP status code", ["code"]
)
LABEL_CONCURRENCY = Gauge(
    "gpu_operator_node_label_concurrency_limit",
    "Node label patches allowed in flight now (adaptive, up to --label-concurrency)",
)
LABEL_DELAY = Histogram(
    "gpu_operator_node_label_delay_seconds",
    "From the Node watch event that called for a label change to its patch being sent",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
LOOP_LAG = Histogram(
    "gpu_operator_event_loop_lag_seconds",
    "How late a timer on the operator's event loop fired: work that held the loop meanwhile "
    "(every watch event and write waits behind it)",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
# OpenShift driver-toolkit gauges keep upstream's names; this operator does not use the DTK.
DTK_ENABLED = Gauge(
    "gpu_operator_openshift_driver_toolkit_enabled",
    "1 enabled, -1 requested but not possible, 0 not requested",
)


async def sample_loop_lag(interval: float = 1.0) -> None:
    """Observe, every `interval` seconds, how late the event loop woke this task: the loop's lag
    sampled at evenly spaced instants. Each sample is a wake-up of an otherwise idle process
    (at 0.1 s, 0.1-0.2 % of a core: as much as a 5,000-node fleet's heartbeats), so once a second."""
    while True:
        started = time.monotonic()
        await asyncio.sleep(interval)
        LOOP_LAG.observe(max(0.0, time.monotonic() - started - interval))


def record_reconcile(report: ReconcileReport) -> None:
    GPU_NODES.set(report.gpu_nodes)
    HAS_NFD.set(1 if report.has_nfd else 0)
    if report.outcome is None:
        STATUS.set(-1)
        return
    RECONCILES.inc()
    if report.outcome.state == vocab.READY:
        STATUS.set(1)
        LAST_SUCCESS.set(time.time())
    else:
        STATUS.set(0)
        FAILED.inc()


def record_error() -> None:
    STATUS.set(-2)
    FAILED.inc()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


async def serve(
    metrics_address: str, health_address: str, is_ready: Callable[[], bool]
) -> list[web.AppRunner]:
    """Start /metrics and /healthz + /readyz; returns the runners to clean up."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if is_ready() else web.Response(status=503, text="not ready")

    runners = []
    for address, routes in (
        (metrics_address, [web.get("/metrics", make_aiohttp_handler())]),
        (health_address, [web.get("/healthz", healthz), web.get("/readyz", readyz)]),
    ):
        if not address or address == "0":
            continue
        app = web.Application()
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        host, port = _split(address)
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    return runners
