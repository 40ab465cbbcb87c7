"""Scale benchmark on the simulator: labelling time, join latency, idle writes, RSS/CPU and the
apiserver's node-patch ceiling, for each node count. Run: .venv/bin/python bench/scale.py --nodes 100 1000"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx2 as httpx  # noqa: E402
from benchkit import (  # noqa: E402
    DRA_WANTED,
    WANTED,
    LabelWatch,
    audit_writes,
    bucket_quantile,
    completed,
    component_cpu,
    counter_by,
    create_nodes,
    feature_gates,
    histogram,
    join_phases,
    metric_sum,
    patch_ceiling,
    percentile,
    proc_stats,
    simulator_load,
    stop_on_sigterm,
    unready_census,
    write_tail,
)
from health import health_phase  # noqa: E402
from lightkube import AsyncClient, Client, KubeConfig  # noqa: E402
from lightkube.codecs import from_dict  # noqa: E402
from lightkube.core.exceptions import ApiError  # noqa: E402
from lightkube.resources.apps_v1 import DaemonSet  # noqa: E402
from lightkube.resources.core_v1 import Namespace, Node, Pod  # noqa: E402
from restart import restart  # noqa: E402
from scaleargs import parse_args  # noqa: E402
from scalereport import COLUMNS, report, table, top_functions, verdicts  # noqa: E402
from spread import order, summary_table  # noqa: E402
from subjects import Subject, apply_peer_crds, on_fresh_plane, start_ours, start_peer  # noqa: E402

from gpu_operator import shapes  # noqa: E402
from gpu_operator.kube.client import ClusterPolicyResource, GPUClusterResource  # noqa: E402
from gpu_operator.kube.crds import apply_crds  # noqa: E402
from gpu_operator.sim.commands import session  # noqa: E402
from gpu_operator.sim.plane import binaries, nodes  # noqa: E402
from gpu_operator.sim.plane.auditlog import AuditReader  # noqa: E402
from gpu_operator.sim.plane.controlplane import ControlPlane  # noqa: E402
from gpu_operator.sim.standins.roster import StandIns  # noqa: E402

HERE = Path(__file__).resolve().parent
SHAPE = "dgx-h100"
OPERATOR_USER = f"system:serviceaccount:{session.OPERATOR_NAMESPACE}:{session.OPERATOR_SA}"
WRITES_METRIC = "gpu_operator_api_write_requests_total"
LIMIT_METRIC = "gpu_operator_node_label_concurrency_limit"
DELAY_METRIC = "gpu_operator_node_label_delay_seconds"
LAG_METRIC = "gpu_operator_event_loop_lag_seconds"
PASSES_METRIC = "gpu_operator_controller_passes"


def say(msg: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def policy_ready(client: Client, gpucluster: bool = False) -> bool:
    """The ClusterPolicy (or with --gpucluster the GPUCluster) is ready (Reconciled)."""
    resource, name = (
        (GPUClusterResource, "gpu-cluster") if gpucluster else (ClusterPolicyResource, "cluster-policy")
    )
    try:
        status = client.get(resource, name).get("status") or {}
    except Exception:  # noqa: BLE001 - not there yet
        return False
    return status.get("state") == "ready" and any(
        c.get("type") == "Ready" and c.get("reason") == "Reconciled" for c in status.get("conditions") or []
    )


async def until_quiet(pid: int, timeout: float, window: float = 2.0, busy: float = 0.1) -> float:
    """Seconds until the process uses less than `busy` of a CPU over `window` seconds."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = proc_stats(pid).cpu_seconds
        await asyncio.sleep(window)
        if proc_stats(pid).cpu_seconds - before < busy * window:
            return time.monotonic() - start - window
    return time.monotonic() - start


def operand_counts(client: Client) -> tuple[int, int]:
    """(ready, desired) operand pods over the operator's DaemonSets (is the cluster settled?)."""
    sets = list(client.list(DaemonSet, namespace=session.OPERATOR_NAMESPACE))
    ready = sum((ds.status.numberReady or 0) if ds.status else 0 for ds in sets)
    desired = sum((ds.status.desiredNumberScheduled or 0) if ds.status else 0 for ds in sets)
    return ready, desired


async def sample_operands(
    sync: Client, t0: float, samples: list[tuple[float, int, int]], every: float = 5.0
) -> None:
    """Until cancelled: (seconds since the policy, operand pods ready, desired) every `every` s.
    A read the busy apiserver does not answer in time is said and skipped: the sampler goes on (it
    died of the first ReadTimeout before, and the progress line repeated its last sample)."""
    while True:
        try:
            counts = await asyncio.to_thread(operand_counts, sync)
        except (httpx.HTTPError, ApiError) as error:
            say(f"operand pods: not read ({type(error).__name__}: {error}); trying again")
        else:
            samples.append((round(time.monotonic() - t0, 1), *counts))
        await asyncio.sleep(every)


def settle_rates(
    samples: list[tuple[float, int, int]], window: float = 15.0
) -> tuple[float | None, float | None]:
    """The simulator's own pace, operand pods made Ready per second: on average from the policy
    to the last sample, and at best over any `window` seconds."""
    if not samples or samples[-1][0] <= 0:
        return None, None
    peak = None
    for i, (t, ready, _) in enumerate(samples):
        later = next((s for s in samples[i + 1 :] if s[0] - t >= window), None)
        if later is not None:
            rate = (later[1] - ready) / (later[0] - t)
            peak = rate if peak is None else max(peak, rate)
    return samples[-1][1] / samples[-1][0], peak


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_fraction(pid: int, seconds_before: float, since: float) -> float:
    return float(proc_stats(pid).cpu_seconds - seconds_before) / max(1e-9, time.monotonic() - since)


def read_policy(path: Path | None) -> dict[str, Any]:
    """The ClusterPolicy both operators get: `spec: {}` by default, or the file's (YAML or JSON)."""
    if path is None:
        return {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
            "spec": {},
        }
    import yaml

    body = yaml.safe_load(path.read_text())
    body["metadata"] = {"name": "cluster-policy"}
    return dict(body)


def read_gpucluster() -> dict[str, Any]:
    """The GPUCluster of --gpucluster: examples/gpucluster.yaml."""
    import yaml

    body: dict[str, Any] = yaml.safe_load((HERE.parent / "examples" / "gpucluster.yaml").read_text())
    return body


async def measure(
    n: int, args: argparse.Namespace, plane: ControlPlane, results_dir: Path, who: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": n, "operator": who, "load_at_start": load()}
    sync = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    client = AsyncClient(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    running: list[Subject] = []  # stopped in `finally`, so a failed run leaves no operator behind
    node_standins: StandIns | None = None
    try:
        t = time.monotonic()
        await create_nodes(client, shapes.nodes([f"{SHAPE}:{n}"]), args.concurrency)
        names = [f"{SHAPE}-{i}" for i in range(n)]
        nodes.wait_ready(sync, names, timeout=60 + n / 5)
        say(f"{n} nodes created and Ready in {time.monotonic() - t:.1f}s")

        if args.sim_window > 0:
            pids = {c.name: c.process.pid for c in plane.components if c.process is not None}
            out["simulator_load"] = await simulator_load(
                plane.server, plane.ssl_context("admin"), pids, args.sim_window
            )
            say(
                f"simulator alone: {out['simulator_load']['writes_per_s']} writes/s, "
                f"{out['simulator_load']['reads_per_s']} reads/s; CPU {out['simulator_load']['cpu_cores']}"
            )

        total = max(n, args.ceiling_patches)
        out["ceiling_patches_per_s"] = await patch_ceiling(client, names, total, args.concurrency)
        say(
            f"ceiling: {out['ceiling_patches_per_s']:.0f} node-label patches/s ({total} patches, "
            f"{args.concurrency} in flight)"
        )

        if who == "peer" and args.peer_crds:
            apply_peer_crds(sync, args.peer_crds)
        else:
            apply_crds(sync)
        sync.create(Namespace(metadata={"name": session.OPERATOR_NAMESPACE}))  # type: ignore[arg-type]
        # What GFD, the device plugin (through the kubelet) and the DRA kubelet plugin do on a node once
        # their pods run there (sim/standins/roster.py, as `sim up` runs them): the operator sees the honest flow.
        hosts = plane.workdir / "hosts" if args.health_faults else None  # our health agent over host trees
        node_standins = StandIns(
            KubeConfig.from_file(plane.admin_kubeconfig), hosts=hosts, nfd=args.nfd
        ).start()

        def launch() -> Subject:
            return (
                start_peer(plane, args.peer_cmd, args.peer_metrics)
                if who == "peer"
                else start_ours(
                    plane,
                    args.concurrency,
                    results_dir / f"operator-{n}.prof" if args.profile else None,
                    args.leader_elect,
                )
            )

        subject = launch()
        running.append(subject)
        pid = subject.pid
        subject.wait_ready(args.ready_timeout)
        out["rss_at_ready_mb"] = proc_stats(pid).rss_mb
        say(f"{who} ready (pid {pid}); RSS {out['rss_at_ready_mb']:.0f} MB")
        # /readyz turns ready before an operator has digested its initial list of N nodes; the
        # policy goes in once it is quiet, so that "created -> labelled" is not start-up time.
        out["startup_digest_s"] = await until_quiet(pid, args.label_timeout)
        say(f"{who} quiet {out['startup_digest_s']:.1f}s after /readyz")
        # Quiet under kwok's churn: no policy yet, nodes heartbeat; CPU as a fraction of a core.
        cpu, t = proc_stats(pid).cpu_seconds, time.monotonic()
        await asyncio.sleep(args.churn_seconds)
        out["churn_cpu_fraction"] = cpu_fraction(pid, cpu, t)
        out["rss_before_policy_mb"] = proc_stats(pid).rss_mb
        say(f"{who} CPU under churn {out['churn_cpu_fraction']:.1%} of a core over {args.churn_seconds:.0f}s")

        watch = LabelWatch(client, wanted=DRA_WANTED if args.gpucluster else WANTED, existing=n)
        watcher = asyncio.create_task(watch.run())
        await asyncio.wait_for(watch.started.wait(), 30 + n / 100)
        cpu0 = proc_stats(pid).cpu_seconds
        rollout_cpu0 = component_cpu(plane, pid)
        t0 = time.monotonic()
        out["load_at_policy"] = load()
        await client.create(from_dict(read_gpucluster() if args.gpucluster else read_policy(args.policy)))
        samples: list[tuple[float, int, int]] = []  # the operand rollout, sampled from the policy on
        sampler = asyncio.create_task(sample_operands(sync, t0, samples))
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
        if subject.metrics_port:  # where our adaptive gate stood after labelling
            out["label_concurrency_limit"] = metric_sum(subject.metrics_port, LIMIT_METRIC)
        say(f"labelled: {out.get('labelled_s')} s")

        if (wait := t0 + args.joins_after - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        out["joins_after_policy_s"] = time.monotonic() - t0
        latencies = []
        joined: dict[str, float] = {}
        join_audit = AuditReader.from_now(plane.audit_log)
        cpu1 = proc_stats(pid).cpu_seconds
        hists0 = (
            {m: histogram(subject.metrics_port, m) for m in (DELAY_METRIC, LAG_METRIC)}
            if subject.metrics_port
            else {}
        )
        passes0 = counter_by(subject.metrics_port, PASSES_METRIC, "loop") if subject.metrics_port else {}
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
            joined[name] = latencies[-1]
            await asyncio.sleep(args.join_gap)
        out["joins"] = len(latencies)
        out["join_p50_s"] = percentile(latencies, 50)
        out["join_p99_s"] = percentile(latencies, 99)
        out["join_max_s"] = max(latencies) if latencies else None
        out["joins_cpu_s"] = proc_stats(pid).cpu_seconds - cpu1
        say(f"joins: p50 {out['join_p50_s']:.3f}s p99 {out['join_p99_s']:.3f}s")
        join_events = list(completed(join_audit))  # the joins' audit events, read and decoded once
        phases = join_phases(join_events, joined, OPERATOR_USER)
        out["join_writes"], out["join_writes_by_kind"] = audit_writes(join_events, OPERATOR_USER)
        say(f"our writes during the joins: {out['join_writes']} {out['join_writes_by_kind']}")
        for key, values in phases.items():
            for q in (50, 99):
                out[f"join_{key}_p{q}_s"] = percentile(values, q) if values else None
        if phases["create"]:
            say(
                f"joins by phase (apiserver audit, {len(phases['create'])} joins), p50/p99 s: "
                + "; ".join(
                    f"{key} {out[f'join_{key}_p50_s']:.3f}/{out[f'join_{key}_p99_s']:.3f}" for key in phases
                )
            )
        if hists0:  # ours: what the joins waited for inside the operator (bucket upper bounds)
            for key, metric in (("join_label_delay", DELAY_METRIC), ("join_loop_lag", LAG_METRIC)):
                after = histogram(subject.metrics_port, metric)
                for q in (50, 99):
                    out[f"{key}_p{q}_le_s"] = bucket_quantile(hists0[metric], after, q / 100)
            passes = counter_by(subject.metrics_port, PASSES_METRIC, "loop")
            out["join_passes"] = {loop: int(n - passes0.get(loop, 0.0)) for loop, n in sorted(passes.items())}
            say(f"passes of our loops during the joins: {out['join_passes']}")
            say(
                f"inside ours during the joins: event -> patch sent p50/p99 <= {out['join_label_delay_p50_le_s']}/"
                f"{out['join_label_delay_p99_le_s']} s; event-loop lag p50/p99 <= {out['join_loop_lag_p50_le_s']}/"
                f"{out['join_loop_lag_p99_le_s']} s"
            )
        watcher.cancel()

        t = time.monotonic()
        deadline = t + args.settle_timeout
        said = 0.0
        while not policy_ready(sync, args.gpucluster) and time.monotonic() < deadline:
            if samples and time.monotonic() - said >= 15:
                said = time.monotonic()
                say(
                    f"settling: {samples[-1][1]}/{samples[-1][2]} operand pods ready, {samples[-1][0]:.0f}s "
                    "after the policy"
                )
            await asyncio.sleep(2)
        out["settled"] = policy_ready(sync, args.gpucluster)
        out["settle_s"] = time.monotonic() - t
        sampler.cancel()
        samples.append((round(time.monotonic() - t0, 1), *operand_counts(sync)))
        out["settle_samples"] = samples
        out["policy_to_ready_s"] = samples[-1][0] if out["settled"] else None
        out["simulator_pods_ready_per_s"], out["simulator_pods_ready_peak_per_s"] = settle_rates(samples)
        out["operand_pods_ready_at_idle"] = f"{samples[-1][1]}/{samples[-1][2]}"
        rollout_cpu = component_cpu(plane, pid)
        out["rollout_cpu_s"] = {k: round(v - rollout_cpu0.get(k, 0.0), 1) for k, v in rollout_cpu.items()}
        say(f"CPU seconds from the policy to now, by process: {out['rollout_cpu_s']}")
        if not out["settled"]:
            try:  # in pages: one list of every pod times out on an apiserver this busy
                pods = await asyncio.to_thread(
                    lambda: list(sync.list(Pod, namespace=session.OPERATOR_NAMESPACE, chunk_size=500))
                )
                fleet = await asyncio.to_thread(lambda: list(sync.list(Node, chunk_size=500)))
                out["unready_pods"] = unready_census(pods, fleet)
                say(f"operand pods not Ready, by DaemonSet and status: {out['unready_pods']}")
            except Exception as error:  # noqa: BLE001 (a census that failed must not end the run)
                say(f"operand pods not Ready: not listed ({type(error).__name__}: {error})")
        say(
            f"{'GPUCluster' if args.gpucluster else 'ClusterPolicy'} {'ready' if out['settled'] else 'NOT ready'} "
            f"after {out['settle_s']:.0f}s more; "
            f"idle window {args.idle_seconds:.0f}s"
        )
        await asyncio.sleep(5)  # let the last status write land before the window opens
        if args.tail_timeout > 0:
            out["tail_s"], out["tail_writes"], out["tail_writes_by_kind"] = await write_tail(
                plane.audit_log, OPERATOR_USER, quiet=15.0, limit=args.tail_timeout
            )
            say(
                f"the rollout's tail: {out['tail_writes']} writes in {out['tail_s']:.0f}s after the policy was "
                f"ready ({out['tail_writes_by_kind']}), then 15 s without one"
            )
        audit = AuditReader.from_now(plane.audit_log)
        writes0 = metric_sum(subject.metrics_port, WRITES_METRIC) if subject.metrics_port else None
        cpu2, t2 = proc_stats(pid).cpu_seconds, time.monotonic()
        out["load_at_idle"] = load()
        await asyncio.sleep(args.idle_seconds)
        out["idle_seconds"] = args.idle_seconds
        out["idle_writes_audit"], out["idle_writes_by_kind"] = audit_writes(completed(audit), OPERATOR_USER)
        out["idle_writes_metric"] = (
            metric_sum(subject.metrics_port, WRITES_METRIC) - writes0
            if subject.metrics_port and writes0 is not None
            else None
        )
        out["idle_cpu_s"] = proc_stats(pid).cpu_seconds - cpu2
        out["idle_cpu_fraction"] = cpu_fraction(pid, cpu2, t2)
        stats = proc_stats(pid)
        out["rss_peak_mb"], out["rss_end_mb"], out["cpu_total_s"] = (
            stats.rss_peak_mb,
            stats.rss_mb,
            stats.cpu_seconds,
        )
        whole_run = completed(AuditReader(plane.audit_log))
        out["writes_total_audit"], out["writes_by_kind"] = audit_writes(whole_run, OPERATOR_USER)
        say(
            f"idle writes: audit {out['idle_writes_audit']}, metric {out['idle_writes_metric']}; "
            f"peak RSS {stats.rss_peak_mb:.0f} MB; CPU {stats.cpu_seconds:.1f}s; load {load()}"
        )
        if hosts is not None:  # bench/health.py: an Xid 79 on --health-faults % of the nodes, then --clear
            out.update(
                await health_phase(
                    client, names, args.health_faults, hosts, pid, plane.audit_log, OPERATOR_USER, args, say
                )
            )
        if (
            args.restart
        ):  # bench/restart.py: SIGTERM, the same command again, until it leads and has caught up
            out["load_at_restart"] = load()
            out.update(
                await asyncio.to_thread(
                    restart,
                    subject,
                    launch,
                    running,
                    sync,
                    session.OPERATOR_NAMESPACE,
                    plane.audit_log,
                    OPERATOR_USER,
                    args.idle_seconds,
                    args.restart_timeout,
                )
            )
            say(
                f"restart: stopped {out['restart_stopped_s']:.1f}s, ready {out['restart_ready_s']}, leads "
                f"{out['restart_leads_s']}, caught up {out['restart_caught_up_s']} s (loops {out['restart_loops']}); "
                f"writes {out['restart_catchup_writes']} + {out.get('restart_idle_writes')} in {args.idle_seconds:.0f}s "
                f"{out['restart_catchup_writes_by_kind']} {out.get('restart_idle_writes_by_kind')}; "
                f"exits {out['restart_exits']}"
            )
        else:
            out["operator_exit"] = subject.stop(60)
        out["load_at_end"] = load()
        if args.profile and who == "ours":
            out["profile_top"] = top_functions(results_dir / f"operator-{n}.prof")
    finally:
        for started in running:
            started.stop(60)
        if node_standins is not None:
            node_standins.stop()
        await client.close()
        sync.close()
    return out


def run_one(
    n: int, args: argparse.Namespace, found: binaries.Binaries, results_dir: Path, who: str
) -> dict[str, Any]:
    async def run(plane: ControlPlane) -> dict[str, Any]:
        return await measure(n, args, plane, results_dir, who)

    row: dict[str, Any] = on_fresh_plane(
        f"bench-scale-{n}-",
        found,
        run,
        say,
        keep=args.keep_workdir,
        node_lease_seconds=args.node_lease_seconds,
        feature_gates=feature_gates(args.feature_gates),
    )
    return row


def main() -> int:
    args = parse_args(__doc__)
    stop_on_sigterm()

    args.out.mkdir(parents=True, exist_ok=True)
    found = binaries.locate(build=True)
    path = args.out / f"scale-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    who = ([] if args.only_peer else ["ours"]) + (["peer"] if args.peer_cmd else [])
    rows: list[dict[str, Any]] = []
    for n, pair, subject in order(args.nodes, who, args.pairs):
        say(f"=== {n} nodes: {subject} (run {pair + 1} of {args.pairs}) ===")
        row = run_one(n, args, found, args.out, subject)
        row["pair"], row["targets_met"] = pair, verdicts(row)
        rows.append(row)
        print(table(rows), flush=True)
        # Written after every run, so that a long run interrupted later keeps what it measured.
        path.write_text(json.dumps(report(rows, args), indent=2, default=str))
    spreads = f"\n\n{summary_table(rows, COLUMNS)}" if args.pairs > 1 else ""
    print(f"\n{table(rows)}{spreads}\n\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
