"""MIG change benchmark on the simulator: N dgx-h100 nodes (default 100) go all-disabled ->
all-1g.10gb at once, and U more (default 20) keep their label; reports the time until every
changed node's `nvidia.com/mig.config.state` is `success` again (seen by a Node watch after its
`pending`) and until the operator reports it (`NvidiaMIGReady` `MIGConfigApplied`), and the API
writes per node from the apiserver's audit log: the operator's (its
ServiceAccount) and the MIG manager stand-in's (sim/standins/migmanager.py, which runs with the other node
stand-ins under the admin user: its requests are told by their field manager). Results go to
bench/results/mig-<time>.json. Run: .venv/bin/python bench/mig.py --nodes 100 --unchanged 20"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import WRITE_VERBS, completed, create_nodes, proc_stats, watch_nodes  # noqa: E402
from lightkube import AsyncClient, Client, KubeConfig  # noqa: E402
from lightkube.resources.core_v1 import Namespace, Node  # noqa: E402
from lightkube.types import PatchType  # noqa: E402
from subjects import on_fresh_plane, start_ours  # noqa: E402

from gpu_operator import shapes  # noqa: E402
from gpu_operator.kube.client import ClusterPolicyResource  # noqa: E402
from gpu_operator.kube.crds import apply_crds  # noqa: E402
from gpu_operator.sim.commands import session  # noqa: E402
from gpu_operator.sim.plane import binaries, nodes  # noqa: E402
from gpu_operator.sim.plane.auditlog import AuditReader  # noqa: E402
from gpu_operator.sim.plane.controlplane import ControlPlane  # noqa: E402
from gpu_operator.sim.standins.roster import StandIns  # noqa: E402
from gpu_operator.vocabulary import (  # noqa: E402
    MIG_APPLIED,
    MIG_CONDITION,
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    MIG_MANAGER_FIELD_MANAGER,
)

HERE = Path(__file__).resolve().parent
SHAPE = "dgx-h100"
OPERATOR_USER = f"system:serviceaccount:{session.OPERATOR_NAMESPACE}:{session.OPERATOR_SA}"
FROM, TO = "all-disabled", "all-1g.10gb"


def say(msg: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


class StateWatch:
    """Per node: its `nvidia.com/mig.config.state` now, and (once `arm`ed) when it was first
    `success` after a `pending`."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.state: dict[str, str | None] = {}
        self.pending: set[str] = set()
        self.done_at: dict[str, float] = {}
        self.reason: dict[str, str] = {}  # node -> its NvidiaMIGReady condition's reason and message
        self.armed = False

    async def run(self) -> None:
        await watch_nodes(self.client, self.see)

    def see(self, node: Node) -> None:
        meta = node.metadata
        assert meta is not None
        name, state = str(meta.name), (meta.labels or {}).get(MIG_CONFIG_STATE)
        self.state[name] = state
        conditions = (node.status.conditions if node.status else None) or []
        self.reason[name] = next(
            (f"{c.reason} {c.message}" for c in conditions if c.type == MIG_CONDITION), ""
        )
        if not self.armed:
            return
        if state == "pending":
            self.pending.add(name)
        elif state == "success" and name in self.pending and name not in self.done_at:
            self.done_at[name] = time.monotonic()

    def count(self, state: str) -> int:
        return sum(1 for s in self.state.values() if s == state)


async def wait(check: Any, timeout: float, what: str, progress: Any) -> bool:
    deadline, last = time.monotonic() + timeout, 0.0
    while time.monotonic() < deadline:
        if check():
            return True
        if time.monotonic() - last > 15:
            say(f"{what}: {progress()}")
            last = time.monotonic()
        await asyncio.sleep(0.5)
    return False


def field_manager(event: dict[str, Any]) -> str:
    query = urllib.parse.urlparse(event.get("requestURI", "")).query
    return str((urllib.parse.parse_qs(query).get("fieldManager") or [""])[0])


def writes_by_node(events: list[dict[str, Any]], names: set[str]) -> dict[str, Any]:
    """Per node the operator's writes to it (nodes, nodes/status) and the MIG manager stand-in's
    (its field manager), with everything else the operator wrote, by verb and resource."""
    ours: Counter[str] = Counter()
    manager: Counter[str] = Counter()
    other: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("verb") not in WRITE_VERBS or ref.get("apiGroup") == "coordination.k8s.io":
            continue
        user = event.get("user", {}).get("username")
        on_node = ref.get("resource") == "nodes" and ref.get("name") in names
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        if user == OPERATOR_USER:
            kinds[f"{event.get('verb')} {ref.get('resource', '?')}{sub}"] += 1
            if on_node:
                ours[ref["name"]] += 1
            else:
                other[f"{event.get('verb')} {ref.get('resource', '?')}{sub}"] += 1
        elif on_node and field_manager(event) == MIG_MANAGER_FIELD_MANAGER:
            manager[ref["name"]] += 1
    return {
        "operator": ours,
        "mig_manager": manager,
        "operator_other": dict(other),
        "operator_kinds": dict(kinds),
    }


def spread(counts: Counter[str], names: list[str]) -> dict[str, float]:
    values = sorted(counts.get(n, 0) for n in names)
    if not values:
        return {}
    return {"min": values[0], "mean": round(sum(values) / len(values), 2), "max": values[-1]}


async def measure(args: argparse.Namespace, plane: ControlPlane) -> dict[str, Any]:
    n, u = args.nodes, args.unchanged
    out: dict[str, Any] = {"nodes": n, "unchanged": u, "load_at_start": os.getloadavg()}
    sync = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    client = AsyncClient(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    standins = subject = None
    try:
        await create_nodes(client, shapes.nodes([f"{SHAPE}:{n + u}"]), 32)
        names = [f"{SHAPE}-{i}" for i in range(n + u)]
        changed, kept = names[:n], names[n:]
        nodes.wait_ready(sync, names, timeout=60 + len(names) / 5)
        apply_crds(sync)
        sync.create(Namespace(metadata={"name": session.OPERATOR_NAMESPACE}))  # type: ignore[arg-type]
        standins = StandIns(KubeConfig.from_file(plane.admin_kubeconfig)).start()
        subject = start_ours(plane, 32, None)
        subject.wait_ready(120)
        watch = StateWatch(client)
        watcher = asyncio.create_task(watch.run())
        spec = {"mig": {"strategy": "single"}, "migManager": {"config": {"default": FROM}}}
        t = time.monotonic()
        await client.create(
            ClusterPolicyResource(  # type: ignore[call-overload]
                apiVersion="nvidia.com/v1",
                kind="ClusterPolicy",
                metadata={"name": "cluster-policy"},
                spec=spec,
            )
        )
        if not await wait(
            lambda: all(watch.state.get(x) == "success" for x in names),
            args.timeout,
            f"{FROM} on every node",
            lambda: f"{watch.count('success')}/{len(names)} success",
        ):
            out["error"] = f"the nodes never all reached success on {FROM}"
            return out
        out["initial_s"] = round(time.monotonic() - t, 1)
        say(f"all {len(names)} nodes {FROM}: success after {out['initial_s']} s; settling {args.settle} s")
        await asyncio.sleep(args.settle)  # the operator's conditions for the first pass

        audit = AuditReader.from_now(plane.audit_log)
        cpu0 = proc_stats(subject.pid).cpu_seconds
        out["load_at_change"] = os.getloadavg()
        watch.armed = True
        t0 = time.monotonic()
        limit = asyncio.Semaphore(32)

        async def change(name: str) -> None:
            async with limit:
                await client.patch(
                    Node, name, {"metadata": {"labels": {MIG_CONFIG: TO}}}, patch_type=PatchType.MERGE
                )

        await asyncio.gather(*(change(x) for x in changed))
        out["patches_sent_s"] = round(time.monotonic() - t0, 2)
        finished = await wait(
            lambda: all(x in watch.done_at for x in changed),
            args.timeout,
            f"{FROM} -> {TO}",
            lambda: f"{len(watch.done_at)}/{n} success, {watch.count('pending')} pending",
        )
        done = sorted(watch.done_at[x] - t0 for x in changed if x in watch.done_at)
        out["all_success_s"] = round(done[-1], 1) if finished else None
        out["success_p50_s"] = round(done[len(done) // 2], 1) if done else None
        out["succeeded"] = len(done)
        reported = f"{MIG_APPLIED} MIG config '{TO}' applied"
        if await wait(
            lambda: all(watch.reason.get(x) == reported for x in changed),
            args.timeout,
            "the operator's NvidiaMIGReady",
            lambda: f"{sum(1 for x in changed if watch.reason.get(x) == reported)}/{n} {MIG_APPLIED}",
        ):
            out["all_reported_s"] = round(time.monotonic() - t0, 1)
        say(
            f"{len(done)}/{n} nodes {TO}: success; the last after {out['all_success_s']} s; reported "
            f"{MIG_APPLIED} after {out.get('all_reported_s')} s; watching writes {args.settle} s more"
        )
        await asyncio.sleep(args.settle)  # anything the operator writes after its report
        out["operator_cpu_s"] = round(proc_stats(subject.pid).cpu_seconds - cpu0, 1)
        out["rss_peak_mb"] = round(proc_stats(subject.pid).rss_peak_mb)
        out["load_at_end"] = os.getloadavg()
        found = writes_by_node(list(completed(audit)), set(names))
        out["operator_writes_changed"] = spread(found["operator"], changed)
        out["operator_writes_unchanged"] = spread(found["operator"], kept)
        out["mig_manager_writes_changed"] = spread(found["mig_manager"], changed)
        out["mig_manager_writes_unchanged"] = spread(found["mig_manager"], kept)
        out["operator_other_writes"] = found["operator_other"]
        out["operator_writes_by_kind"] = found["operator_kinds"]
        say(
            f"operator writes per changed node {out['operator_writes_changed']}, per unchanged node "
            f"{out['operator_writes_unchanged']}; MIG manager's per changed node {out['mig_manager_writes_changed']}"
        )
        watcher.cancel()
    finally:
        if subject is not None:
            subject.stop(60)
        if standins is not None:
            standins.stop()
        await client.close()
        sync.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100, help="nodes whose mig.config changes")
    parser.add_argument("--unchanged", type=int, default=20, help="nodes whose mig.config stays as it is")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--settle", type=float, default=20.0, help="seconds of writes counted after the change"
    )
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args()
    found = binaries.locate(build=True)
    row = on_fresh_plane(
        f"bench-mig-{args.nodes}-", found, lambda plane: measure(args, plane), say, keep=args.keep_workdir
    )
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "run": row,
    }
    out = HERE / "results" / f"mig-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=dict))
    print(json.dumps(report, indent=2, default=dict))
    return 0 if row.get("all_success_s") else 1


if __name__ == "__main__":
    sys.exit(main())
