"""The scale benchmark's report (bench/scale.py): its targets and each run's verdicts, the table
printed after every run (with ours against the peer's ratios), the JSON report and the operator's
most expensive functions when it ran under cProfile."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import pstats
from pathlib import Path
from typing import Any

from spread import summarise

# issue 25 item 6
TARGETS = {
    "labelled_fraction_of_ceiling": 0.9,
    "join_p99_s": {1000: 0.5, 5000: 1.0},
    "idle_writes": 0,
    "rss_mb": 150.0,
    "quiet_after_ready_s": 10.0,
    "busy_fraction": 0.1,
    "idle_cpu_fraction": 0.01,
}


def top_functions(path: Path, limit: int = 25) -> list[str]:
    """The operator's most expensive functions by own time (cProfile), as text lines."""
    if not path.exists():
        return [f"no profile at {path}"]
    stats = pstats.Stats(str(path))
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:limit]  # type: ignore[attr-defined]
    return [
        f"{tt:8.2f}s own {ct:8.2f}s cum {nc:>9} calls  {func[0].split('site-packages/')[-1]}:{func[1]}"
        f"({func[2]})"
        for func, (_cc, nc, tt, ct, _callers) in rows
    ]


def verdicts(row: dict[str, Any]) -> dict[str, bool | None]:
    fraction = row.get("labelling_fraction_of_ceiling")
    join_target = TARGETS["join_p99_s"].get(row["nodes"])  # type: ignore[attr-defined]
    return {
        "quiet_after_ready": row.get("startup_digest_s", float("inf")) <= TARGETS["quiet_after_ready_s"],
        "quiet_under_churn": row.get("churn_cpu_fraction", 1.0) < TARGETS["busy_fraction"],
        "labelled_of_ceiling": None
        if fraction is None
        else fraction >= TARGETS["labelled_fraction_of_ceiling"],
        "join_p99": None if join_target is None else row.get("join_p99_s", float("inf")) <= join_target,
        "idle_writes": row.get("idle_writes_audit") == TARGETS["idle_writes"],
        "idle_cpu": row.get("idle_cpu_fraction", 1.0) <= TARGETS["idle_cpu_fraction"],
        "rss": row.get("rss_peak_mb", float("inf")) <= TARGETS["rss_mb"],
    }


COLUMNS = [  # (heading, key, format)
    ("quiet after ready s", "startup_digest_s", ".1f"),
    ("churn CPU", "churn_cpu_fraction", ".1%"),
    ("labelled s", "labelled_s", ".2f"),
    ("rate/s", "labelling_rate_per_s", ".0f"),
    ("ceiling/s", "ceiling_patches_per_s", ".0f"),
    ("of ceiling", "labelling_fraction_of_ceiling", ".0%"),
    ("join p50 s", "join_p50_s", ".3f"),
    ("join p99 s", "join_p99_s", ".3f"),
    ("policy -> ready s", "policy_to_ready_s", ".0f"),
    ("sim pods ready/s avg", "simulator_pods_ready_per_s", ".0f"),
    ("peak", "simulator_pods_ready_peak_per_s", ".0f"),
    ("tail s (writes)", "tail_s", ".0f"),
    ("tail writes", "tail_writes", "d"),
    ("idle writes", "idle_writes_audit", "d"),
    ("idle CPU", "idle_cpu_fraction", ".2%"),
    ("peak RSS MB", "rss_peak_mb", ".0f"),
    ("CPU s", "cpu_total_s", ".1f"),
    ("restart: leads s", "restart_leads_s", ".1f"),
    ("caught up s", "restart_caught_up_s", ".1f"),
    ("writes after", "restart_writes", "d"),
]


def table(rows: list[dict[str, Any]]) -> str:
    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec) if isinstance(value, int | float) else str(value)

    head = ["nodes", "operator", *(h for h, _, _ in COLUMNS), "idle window", "load (policy/idle)"]
    lines = [" | ".join(head), " | ".join("-" * len(h) for h in head)]
    for r in rows:
        lines.append(
            " | ".join(
                [
                    str(r["nodes"]),
                    r["operator"],
                    *(fmt(r.get(k), f) for _, k, f in COLUMNS),
                    f"{r.get('idle_seconds', 0):.0f}s",
                    f"{r.get('load_at_policy')} / {r.get('load_at_idle')}",
                ]
            )
        )
    for n in sorted({r["nodes"] for r in rows}):
        ours = next((r for r in rows if r["nodes"] == n and r["operator"] == "ours"), None)
        peer = next((r for r in rows if r["nodes"] == n and r["operator"] == "peer"), None)
        if ours and peer:
            cells = []
            for _, key, _spec in COLUMNS:
                a, b = ours.get(key), peer.get(key)
                cells.append(
                    f"{b / a:.1f}x"
                    if isinstance(a, int | float) and isinstance(b, int | float) and a
                    else "-"
                )
            lines.append(" | ".join([str(n), "peer/ours", *cells, "", ""]))
    return "\n".join(lines)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "targets": TARGETS,
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": rows,
        "summary": summarise(rows, COLUMNS),
    }
