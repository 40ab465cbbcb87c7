"""Scale benchmark on the simulator: labelling time, join latency, idle writes, RSS/CPU and the
apiserver's node-patch ceiling, for each node count. Run: .venv/bin/python bench/scale.py --nodes 100 1000"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import (  # noqa: E402
    LabelWatch,
    audit_writes,
    create_nodes,
    metric_sum,
    patch_ceiling,
    percentile,
    proc_stats,
)
from lightkube import AsyncClient, Client, KubeConfig  # noqa: E402
from lightkube.resources.apps_v1 import DaemonSet  # noqa: E402
from lightkube.resources.core_v1 import Namespace  # noqa: E402

from gpu_operator import shapes  # noqa: E402
from gpu_operator.kube.client import ClusterPolicyResource  # noqa: E402
from gpu_operator.kube.crds import apply_crds  # noqa: E402
from gpu_operator.sim import binaries, nodes, session  # noqa: E402
from gpu_operator.sim.controlplane import ControlPlane  # noqa: E402
from gpu_operator.sim.operator_process import PROFILE_ENV, OperatorProcess  # noqa: E402
from gpu_operator.sim.state import Proc  # noqa: E402

HERE = Path(__file__).resolve().parent
SHAPE = "dgx-h100"
OPERATOR_USER = f"system:serviceaccount:{session.OPERATOR_NAMESPACE}:{session.OPERATOR_SA}"
WRITES_METRIC = "gpu_operator_api_write_requests_total"
TARGETS = {"labelled_5000_s": 10.0, "join_p99_s": 1.0, "idle_writes": 0, "rss_mb": 150.0}


def say(msg: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def policy_ready(client: Client) -> bool:
    try:
        status = client.get(ClusterPolicyResource, "cluster-policy").get("status") or {}
    except Exception:  # noqa: BLE001 - not there yet
        return False
    return status.get("state") == "ready" and any(
        c.get("type") == "Ready" and c.get("reason") == "Reconciled" for c in status.get("conditions") or [])


async def until_quiet(pid: int, timeout: float, window: float = 2.0, busy: float = 0.1) -> float:
    """Seconds until the process uses less than `busy` of a CPU over `window` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = proc_stats(pid).cpu_seconds
        await asyncio.sleep(window)
        if proc_stats(pid).cpu_seconds - before < busy * window:
            return time.monotonic() - start - window
    return time.monotonic() - start


def operand_pods(client: Client) -> str:
    """"ready/desired" operand pods over the operator's DaemonSets (is the cluster settled?)."""
    sets = list(client.list(DaemonSet, namespace=session.OPERATOR_NAMESPACE))
    ready = sum((ds.status.numberReady or 0) if ds.status else 0 for ds in sets)
    desired = sum((ds.status.desiredNumberScheduled or 0) if ds.status else 0 for ds in sets)
    return f"{ready}/{desired}"


async def measure(n: int, args: argparse.Namespace, plane: ControlPlane, results_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": n}
    sync = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    client = AsyncClient(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    try:
        t = time.monotonic()
        await create_nodes(client, shapes.nodes([f"{SHAPE}:{n}"]), args.concurrency)
        names = [f"{SHAPE}-{i}" for i in range(n)]
        nodes.wait_ready(sync, names, timeout=60 + n / 5)
        say(f"{n} nodes created and Ready in {time.monotonic() - t:.1f}s")

        total = max(n, args.ceiling_patches)
        out["ceiling_patches_per_s"] = await patch_ceiling(client, names, total, args.concurrency)
        say(f"ceiling: {out['ceiling_patches_per_s']:.0f} node-label patches/s ({total} patches, "
            f"{args.concurrency} in flight)")

        apply_crds(sync)
        sync.create(Namespace(metadata={"name": session.OPERATOR_NAMESPACE}))  # type: ignore[arg-type]
        env = {PROFILE_ENV: str(results_dir / f"operator-{n}.prof")} if args.profile else {}
        operator = OperatorProcess(kubeconfig=session.operator_kubeconfig(plane),
                                   namespace=session.OPERATOR_NAMESPACE,
                                   log=plane.workdir / "logs" / "operator.log",
                                   extra_args=[f"--label-concurrency={args.concurrency}"], env=env).start()
        assert operator.process is not None
        pid = operator.process.pid
        session.wait_operator_ready(operator.health_port, Proc.of("operator", pid, operator.log), 120)
        say(f"operator ready (pid {pid}); RSS {proc_stats(pid).rss_mb:.0f} MB")
        # /readyz turns ready before the operator has digested its initial list of N nodes; the
        # policy goes in once it is quiet, so that "created -> labelled" is not start-up time.
        out["startup_digest_s"] = await until_quiet(pid, args.label_timeout)
        say(f"operator quiet {out['startup_digest_s']:.1f}s after /readyz")

        watch = LabelWatch(client)
        watcher = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.started.wait(), 30)
        cpu0 = proc_stats(pid).cpu_seconds
        t0 = time.monotonic()
        await client.create(ClusterPolicyResource(  # type: ignore[call-overload]
            apiVersion="nvidia.com/v1", kind="ClusterPolicy", metadata={"name": "cluster-policy"}, spec={}))
        done = await watch.wait_all(names, args.label_timeout)
        if done:
            out["labelled_s"] = max(watch.labelled_at[name] for name in names) - t0
            out["labelled_first_s"] = min(watch.labelled_at[name] for name in names) - t0
            out["labelling_rate_per_s"] = n / out["labelled_s"]
            out["labelling_fraction_of_ceiling"] = out["labelling_rate_per_s"] / out["ceiling_patches_per_s"]
        else:
            out["labelled_s"] = None
            out["labelled_count"] = sum(1 for name in names if name in watch.labelled_at)
        out["labelling_cpu_s"] = proc_stats(pid).cpu_seconds - cpu0
        say(f"labelled: {out.get('labelled_s')} s")

        latencies = []
        cpu1 = proc_stats(pid).cpu_seconds
        for i in range(args.joins):
            manifest = shapes.nodes([SHAPE], start=n + i)[0]
            name = manifest["metadata"]["name"]
            event = watch.waiter(name)
            start = time.monotonic()
            await create_nodes(client, [manifest], 1)
            try:
                await asyncio.wait_for(event.wait(), args.join_timeout)
                latencies.append(watch.labelled_at[name] - start)
            except TimeoutError:
                latencies.append(float("inf"))
            await asyncio.sleep(args.join_gap)
        out["joins"] = len(latencies)
        out["join_p50_s"] = percentile(latencies, 50)
        out["join_p99_s"] = percentile(latencies, 99)
        out["join_max_s"] = max(latencies) if latencies else None
        out["joins_cpu_s"] = proc_stats(pid).cpu_seconds - cpu1
        say(f"joins: p50 {out['join_p50_s']:.3f}s p99 {out['join_p99_s']:.3f}s")
        watcher.cancel()

        t = time.monotonic()
        deadline = t + args.settle_timeout
        while not policy_ready(sync) and time.monotonic() < deadline:
            await asyncio.sleep(2)
        out["settled"] = policy_ready(sync)
        out["settle_s"] = time.monotonic() - t
        out["operand_pods_ready_at_idle"] = operand_pods(sync)
        say(f"ClusterPolicy {'ready' if out['settled'] else 'NOT ready'} after {out['settle_s']:.0f}s more; "
            f"idle window {args.idle_seconds:.0f}s")
        await asyncio.sleep(5)  # let the last status write land before the window opens
        offset = plane.audit_log.stat().st_size
        writes0 = metric_sum(operator.metrics_port, WRITES_METRIC)
        cpu2 = proc_stats(pid).cpu_seconds
        await asyncio.sleep(args.idle_seconds)
        out["idle_seconds"] = args.idle_seconds
        out["idle_writes_audit"], out["idle_writes_by_kind"] = audit_writes(plane.audit_log, offset, OPERATOR_USER)
        out["idle_writes_metric"] = metric_sum(operator.metrics_port, WRITES_METRIC) - writes0
        out["idle_cpu_s"] = proc_stats(pid).cpu_seconds - cpu2
        stats = proc_stats(pid)
        out["rss_peak_mb"], out["rss_end_mb"], out["cpu_total_s"] = stats.rss_peak_mb, stats.rss_mb, stats.cpu_seconds
        out["writes_total_metric"] = metric_sum(operator.metrics_port, WRITES_METRIC)
        out["operator_exit"] = operator.stop(60)
        say(f"idle writes: audit {out['idle_writes_audit']}, metric {out['idle_writes_metric']:.0f}; "
            f"peak RSS {stats.rss_peak_mb:.0f} MB; CPU {stats.cpu_seconds:.1f}s")
        if args.profile:
            out["profile_top"] = top_functions(results_dir / f"operator-{n}.prof")
    finally:
        await client.close()
        sync.close()
    return out


def top_functions(path: Path, limit: int = 25) -> list[str]:
    """The operator's most expensive functions by own time (cProfile), as text lines."""
    if not path.exists():
        return [f"no profile at {path}"]
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:limit]  # type: ignore[attr-defined]
    return [f"{tt:8.2f}s own {ct:8.2f}s cum {nc:>9} calls  {func[0].split('site-packages/')[-1]}:{func[1]}"
            f"({func[2]})" for func, (_cc, nc, tt, ct, _callers) in rows]


def run_one(n: int, args: argparse.Namespace, found: binaries.Binaries, results_dir: Path) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
    plane = ControlPlane(workdir, found, progress=lambda m: say(f"control plane: {m}"))
    plane.start()
    try:
        return asyncio.run(measure(n, args, plane, results_dir))
    finally:
        plane.stop()
        if args.keep_workdir:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def verdicts(row: dict[str, Any]) -> dict[str, bool | None]:
    labelled = row.get("labelled_s")
    return {
        # The labelling target is stated for 5,000 nodes; smaller runs are judged pro rata.
        "labelled": None if labelled is None else labelled <= TARGETS["labelled_5000_s"] * row["nodes"] / 5000,
        "join_p99": row.get("join_p99_s", float("inf")) <= TARGETS["join_p99_s"],
        "idle_writes": row.get("idle_writes_audit") == TARGETS["idle_writes"],
        "rss": row.get("rss_peak_mb", float("inf")) <= TARGETS["rss_mb"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    def fmt(value: Any, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)

    head = ["nodes", "labelled s", "rate/s", "ceiling/s", "of ceiling", "join p50", "join p99",
            "idle writes (audit/metric)", "peak RSS MB", "CPU s"]
    lines = [" | ".join(head), " | ".join("-" * len(h) for h in head)]
    for r in rows:
        frac = r.get("labelling_fraction_of_ceiling")
        lines.append(" | ".join([
            str(r["nodes"]), fmt(r.get("labelled_s")), fmt(r.get("labelling_rate_per_s"), ".0f"),
            fmt(r.get("ceiling_patches_per_s"), ".0f"), "-" if frac is None else f"{frac:.0%}",
            fmt(r.get("join_p50_s"), ".3f"), fmt(r.get("join_p99_s"), ".3f"),
            f"{r.get('idle_writes_audit')}/{fmt(r.get('idle_writes_metric'), '.0f')} in {r['idle_seconds']:.0f}s",
            fmt(r.get("rss_peak_mb"), ".0f"), fmt(r.get("cpu_total_s"), ".1f"),
        ]))
    return "\n".join(lines)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE")
                    * os.sysconf("SC_PHYS_PAGES") / 2**30, 1), "python": platform.python_version(),
                    "loadavg_at_end": os.getloadavg()},
        "targets": TARGETS, "args": {k: str(v) for k, v in vars(args).items()}, "runs": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument("--joins", type=int, default=100)
    parser.add_argument("--join-gap", type=float, default=0.2, help="seconds between two joins")
    parser.add_argument("--join-timeout", type=float, default=30.0)
    parser.add_argument("--label-timeout", type=float, default=600.0)
    parser.add_argument("--settle-timeout", type=float, default=900.0,
                        help="max wait for the ClusterPolicy to be ready before the idle window")
    parser.add_argument("--concurrency", type=int, default=32, help="patches in flight (operator and ceiling)")
    parser.add_argument("--ceiling-patches", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="run the operator under cProfile")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    found = binaries.locate(build=True)
    path = args.out / f"scale-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    rows: list[dict[str, Any]] = []
    for n in args.nodes:
        say(f"=== {n} nodes ===")
        row = run_one(n, args, found, args.out)
        row["targets_met"] = verdicts(row)
        rows.append(row)
        print(table(rows), flush=True)
        # Written after every size, so that a long run interrupted later keeps what it measured.
        path.write_text(json.dumps(report(rows, args), indent=2, default=str))
    print(f"\n{table(rows)}\n\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
