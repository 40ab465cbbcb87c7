"""Driver upgrade benchmark on the simulator: N nodes (default 1,000), maxParallelUpgrades 100,
driver version changed once; reports total time, peak parallelism (watched), API writes per node
(audit log) and the operator's CPU. With --peer-cmd (as bench/scale.py) the same run follows
for that operator on a fresh simulator of its own. Run: .venv/bin/python bench/upgrade.py --nodes 1000"""

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

from benchkit import audit_writes, completed, create_nodes, proc_stats, watch_nodes  # noqa: E402
from lightkube import AsyncClient, Client, KubeConfig  # noqa: E402
from lightkube.resources.core_v1 import Namespace, Node  # noqa: E402
from lightkube.types import PatchType  # noqa: E402
from subjects import apply_peer_crds, on_fresh_plane, start_ours, start_peer  # noqa: E402

from gpu_operator import shapes  # noqa: E402
from gpu_operator.controllers.units.upgrade.state import ACTIVE, UPGRADE_DONE  # noqa: E402
from gpu_operator.kube.client import ClusterPolicyResource  # noqa: E402
from gpu_operator.kube.crds import apply_crds  # noqa: E402
from gpu_operator.sim.commands import session  # noqa: E402
from gpu_operator.sim.plane import binaries, nodes  # noqa: E402
from gpu_operator.sim.plane.auditlog import AuditReader  # noqa: E402
from gpu_operator.sim.plane.controlplane import ControlPlane  # noqa: E402
from gpu_operator.vocabulary import UPGRADE_STATE  # noqa: E402

HERE = Path(__file__).resolve().parent
SHAPE = "dgx-h100"
OPERATOR_USER = f"system:serviceaccount:{session.OPERATOR_NAMESPACE}:{session.OPERATOR_SA}"
# Driver and validator only: the upgrade touches those; the other operands would only add pods.
OFF = ("toolkit", "devicePlugin", "dcgmExporter", "gfd", "migManager", "nodeStatusExporter", "dcgm")


def say(msg: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


class StateWatch:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.states: dict[str, str] = {}
        self.peak = 0
        self.active = 0

    async def run(self) -> None:
        await watch_nodes(self.client, self.see)

    def see(self, node: Node) -> None:
        meta = node.metadata
        assert meta is not None
        state = (meta.labels or {}).get(UPGRADE_STATE, "")
        self.states[str(meta.name)] = state
        self.active = sum(1 for s in self.states.values() if s in ACTIVE)
        self.peak = max(self.peak, self.active)

    def count(self, state: str) -> int:
        return sum(1 for s in self.states.values() if s == state)


async def wait_done(watch: StateWatch, n: int, timeout: float, what: str) -> bool:
    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        if watch.count(UPGRADE_DONE) >= n:
            return True
        if time.monotonic() - last > 15:
            say(f"{what}: {watch.count(UPGRADE_DONE)}/{n} upgrade-done, {watch.active} in flight")
            last = time.monotonic()
        await asyncio.sleep(0.5)
    return False


async def measure(n: int, args: argparse.Namespace, plane: ControlPlane, who: str) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": n, "operator": who, "max_parallel": args.max_parallel}
    sync = Client(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    client = AsyncClient(KubeConfig.from_file(plane.admin_kubeconfig), field_manager="bench")
    subject = None
    try:
        await create_nodes(client, shapes.nodes([f"{SHAPE}:{n}"]), 32)
        names = [f"{SHAPE}-{i}" for i in range(n)]
        nodes.wait_ready(sync, names, timeout=60 + n / 5)
        if who == "peer" and args.peer_crds:
            apply_peer_crds(sync, args.peer_crds)
        else:
            apply_crds(sync)
        sync.create(Namespace(metadata={"name": session.OPERATOR_NAMESPACE}))  # type: ignore[arg-type]
        subject = start_peer(plane, args.peer_cmd) if who == "peer" else start_ours(plane, 32, None)
        pid = subject.pid
        subject.wait_ready(120)
        watch = StateWatch(client)
        watcher = asyncio.create_task(watch.run())
        # operator and daemonsets: required by the peer's CRD schema (ours defaults them)
        spec: dict[str, Any] = {"operator": {}, "daemonsets": {}, **{k: {"enabled": False} for k in OFF}}
        # podDeletion and waitForCompletion as NVIDIA's sample policy sets them: the peer refuses an
        # upgrade without podDeletion ("pod deletion spec should not be empty"); ours defaults it
        spec["driver"] = {
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallelUpgrades": args.max_parallel,
                "maxUnavailable": "100%",
                "drain": {"enable": False},
                "waitForCompletion": {"timeoutSeconds": 0},
                "podDeletion": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
            }
        }
        t = time.monotonic()
        await client.create(
            ClusterPolicyResource(  # type: ignore[call-overload]
                apiVersion="nvidia.com/v1",
                kind="ClusterPolicy",
                metadata={"name": "cluster-policy"},
                spec=spec,
            )
        )
        if not await wait_done(watch, n, args.timeout, "initial"):
            out["error"] = "nodes never reached upgrade-done before the upgrade"
            return out
        out["initial_s"] = time.monotonic() - t
        say(f"all {n} nodes upgrade-done (driver pods in sync) after {out['initial_s']:.0f}s")
        await asyncio.sleep(5)

        audit = AuditReader.from_now(plane.audit_log)
        cpu0 = proc_stats(pid).cpu_seconds
        watch.peak = 0
        t0 = time.monotonic()
        sync.patch(
            ClusterPolicyResource,
            "cluster-policy",
            {"spec": {"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}}},
            patch_type=PatchType.MERGE,
        )
        while watch.count(UPGRADE_DONE) >= n and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.2)  # until the new revision shows
        done = await wait_done(watch, n, args.timeout, "upgrade")
        out["upgrade_s"] = time.monotonic() - t0 if done else None
        out["done"] = watch.count(UPGRADE_DONE)
        out["peak_parallel"] = watch.peak
        out["operator_cpu_s"] = proc_stats(pid).cpu_seconds - cpu0
        writes, by_kind = audit_writes(completed(audit), OPERATOR_USER)
        out["writes"], out["writes_by_kind"] = writes, by_kind
        out["writes_per_node"] = writes / n
        out["rss_peak_mb"] = proc_stats(pid).rss_peak_mb
        say(
            f"{who} upgrade: {out['upgrade_s']} s, peak {watch.peak} in flight, {writes / n:.1f} writes/node, "
            f"operator CPU {out['operator_cpu_s']:.1f}s"
        )
        watcher.cancel()
    finally:
        if subject is not None:  # a failed run must not leave the operator running
            subject.stop(60)
        await client.close()
        sync.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--max-parallel", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--peer-cmd", help="also run this operator (placeholders as bench/scale.py)")
    parser.add_argument("--peer-crds", type=Path, help="directory of CRD files to apply for the peer")
    parser.add_argument("--only-peer", action="store_true", help="with --peer-cmd: skip our operator")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "upgrade.json")
    args = parser.parse_args()
    found = binaries.locate(build=True)
    rows = []
    for who in ([] if args.only_peer else ["ours"]) + (["peer"] if args.peer_cmd else []):
        say(f"=== {args.nodes} nodes: {who} ===")
        rows.append(
            on_fresh_plane(
                f"bench-upgrade-{args.nodes}-",
                found,
                lambda plane, who=who: measure(args.nodes, args, plane, who),
                say,
                keep=args.keep_workdir,
            )
        )
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if rows and all(row.get("upgrade_s") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
