"""The operator's memory under a burst of node events: label churn (which reaches the labelling
loop) and status churn (heartbeat-like, filtered at the watch) on every node. A warm-up burst
first fills the caches; a burst ten times larger must then leave the resident set where it was:
work is coalesced per node (a set of dirty names, not a queue of events), nothing grows per event."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.chaos import HEAVY, rss_bytes
from tests.support.status import reconciled
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]
MB = 1024 * 1024
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"


def churn(kube: Client, names: list[str], rounds: int, tag: str) -> int:
    """`rounds` label changes and `rounds` status (condition heartbeat) changes per node; returns
    how many Node writes were sent (each one a watch event at the operator)."""

    def one(name: str) -> int:
        for i in range(rounds):
            kube.patch(
                Node,
                name,
                {"metadata": {"labels": {"chaos.example.com/churn": f"{tag}-{i}"}}},
                patch_type=PatchType.MERGE,
            )
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            kube.patch(
                Node.Status,
                name,
                {
                    "status": {
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "KubeletReady",
                                "message": f"{tag}-{i}",
                                "lastHeartbeatTime": now,
                                "lastTransitionTime": now,
                            }
                        ]
                    }
                },
                patch_type=PatchType.STRATEGIC,
            )
        return 2 * rounds

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(one, names))


def settled_rss(operator: OperatorProcess, pid: int) -> int:
    """RSS once the operator has worked through what it was sent (two equal looks 2 s apart)."""
    looks = [rss_bytes(pid)]

    def steady() -> bool:
        looks.append(rss_bytes(pid))
        return abs(looks[-1] - looks[-2]) < 1 * MB

    wait_for("the operator's RSS to settle", steady, interval=2, timeout=120, context=operator.log_text)
    return looks[-1]


def test_memory_stays_bounded_under_a_10x_burst_of_node_events(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    record_property: Callable[[str, object], None],
) -> None:
    count, rounds = (200, 10) if HEAVY else (20, 3)
    names = fake_nodes(f"dgx-h100:{count}")
    operator = start_operator()
    cluster_policies({})
    reconciled(kube, timeout=240, context=operator.log_text)
    assert operator.process is not None
    pid = operator.process.pid
    idle = settled_rss(operator, pid)

    started = time.monotonic()
    warm_events = churn(kube, names, rounds, "warm")
    warm = settled_rss(operator, pid)
    burst_events = churn(kube, names, 10 * rounds, "burst")
    burst_seconds = time.monotonic() - started
    after = settled_rss(operator, pid)
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    growth = after - warm
    per_event = growth / burst_events
    for key, value in (
        ("rss_idle_mb", idle / MB),
        ("rss_after_warmup_mb", warm / MB),
        ("rss_after_10x_burst_mb", after / MB),
        ("rss_peak_mb", peak / MB),
    ):
        record_property(key, round(value, 1))
    print(
        f"memory: {count} nodes; idle {idle / MB:.1f} MB, after {warm_events} events {warm / MB:.1f} MB, "
        f"after {burst_events} more {after / MB:.1f} MB (peak {peak / MB:.1f} MB; "
        f"{per_event:.0f} B per event; bursts took {burst_seconds:.0f} s)"
    )
    # Everything the operator keeps is per node, so ten times the events add (almost) nothing;
    # the allowance covers the allocator's arenas, not anything per event.
    assert growth < 12 * MB, f"RSS grew {growth / MB:.1f} MB over {burst_events} node events"
    assert per_event < 1024, f"{per_event:.0f} bytes per node event"
    assert operator.alive
    for name in names:  # still labelled: the churn took nothing away
        assert (kube.get(Node, name).metadata.labels or {}).get(DEPLOY_DRIVER) == "true", name
    reconciled(kube, context=operator.log_text)
