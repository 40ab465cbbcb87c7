"""Figures that hold on a noisy machine: runs of two operators interleaved (A B A B ...), summed up
per node count and operator as the median of each figure with its spread (smallest and largest).

`bench/scale.py --pairs K` runs ours and the peer K times each, alternating, each on a fresh
control plane, so that whatever else loads the machine meets both alike; `summary_table` is what
it prints at the end and what bench/README.md quotes (`median [min-max]`)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

# (heading, key, format) of scale.COLUMNS; passed in, so this module stays free of the bench's own
Column = tuple[str, str, str]


def order(nodes: Iterable[int], who: list[str], pairs: int) -> list[tuple[int, int, str]]:
    """(node count, pair number, operator) in the order to run them: for each node count, pair
    after pair, each pair ours then the peer (A B A B ...). One pair is the plain sequence."""
    return [(n, pair, subject) for n in nodes for pair in range(pairs) for subject in who]


def spread(values: list[float | int]) -> dict[str, float | int]:
    """Median, smallest, largest and how many runs gave the figure."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def summarise(rows: list[dict[str, Any]], columns: list[Column]) -> list[dict[str, Any]]:
    """One entry per (node count, operator): each column's spread over the runs that report it
    (a figure a run did not reach, such as a join p99 where no join finished, is left out of it
    and the entry says in how many runs it was found)."""
    out: list[dict[str, Any]] = []
    keys = sorted({(r["nodes"], r["operator"]) for r in rows}, key=lambda k: (k[0], k[1] != "ours", k[1]))
    for n, who in keys:
        mine = [r for r in rows if r["nodes"] == n and r["operator"] == who]
        figures: dict[str, dict[str, float | int]] = {}
        for _, key, _ in columns:
            values = [
                r[key]
                for r in mine
                if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
            ]
            if values:
                figures[key] = spread(values)
        out.append({"nodes": n, "operator": who, "runs": len(mine), "figures": figures})
    return out


def _number(value: float | int, spec: str) -> str:
    if spec.endswith("d"):  # a count; a median of two counts may fall between them (0.5 writes)
        return format(int(value), spec) if float(value).is_integer() else format(value, ".1f")
    return format(value, spec)


def _cell(figure: dict[str, float | int] | None, spec: str, runs: int) -> str:
    if figure is None:
        return "-"
    text = (
        f"{_number(figure['median'], spec)} [{_number(figure['min'], spec)}-{_number(figure['max'], spec)}]"
    )
    return text if figure["runs"] == runs else f"{text} ({figure['runs']} of {runs})"


def summary_table(rows: list[dict[str, Any]], columns: list[Column]) -> str:
    """Markdown: per node count and operator, each figure as `median [min-max]`."""
    head = ["nodes", "operator", "runs", *(h for h, _, _ in columns)]
    lines = [" | ".join(head), " | ".join("-" * len(h) for h in head)]
    for entry in summarise(rows, columns):
        cells = [_cell(entry["figures"].get(key), spec, entry["runs"]) for _, key, spec in columns]
        lines.append(" | ".join([str(entry["nodes"]), entry["operator"], str(entry["runs"]), *cells]))
    return "\n".join(lines)
