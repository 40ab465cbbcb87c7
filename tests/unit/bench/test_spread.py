"""bench/spread.py: the interleaved order of `scale.py --pairs` and the median [min-max] summary."""

from __future__ import annotations

from tests.support.benchload import bench_module

spread = bench_module("spread")
COLUMNS = [
    ("labelled s", "labelled_s", ".2f"),
    ("join p99 s", "join_p99_s", ".3f"),
    ("idle writes", "idle_writes", "d"),
]


def test_runs_alternate_ours_and_the_peer_pair_after_pair_for_each_node_count() -> None:
    assert spread.order([100, 1000], ["ours", "peer"], 2) == [
        (100, 0, "ours"),
        (100, 0, "peer"),
        (100, 1, "ours"),
        (100, 1, "peer"),
        (1000, 0, "ours"),
        (1000, 0, "peer"),
        (1000, 1, "ours"),
        (1000, 1, "peer"),
    ]
    assert spread.order([5], ["ours"], 1) == [(5, 0, "ours")]


def test_each_figure_is_its_median_with_the_smallest_and_largest() -> None:
    rows = [
        {"nodes": 100, "operator": "peer", "labelled_s": 5.0, "join_p99_s": None, "idle_writes": 3},
        {"nodes": 100, "operator": "ours", "labelled_s": 1.4, "join_p99_s": 0.3, "idle_writes": 0},
        {"nodes": 100, "operator": "ours", "labelled_s": 1.0, "join_p99_s": 0.2, "idle_writes": 0},
        {"nodes": 100, "operator": "peer", "labelled_s": 6.0, "join_p99_s": 1.0, "idle_writes": 1},
        {"nodes": 100, "operator": "ours", "labelled_s": 1.1, "join_p99_s": 0.25, "idle_writes": 0},
        {"nodes": 100, "operator": "peer", "labelled_s": 5.5, "join_p99_s": None, "idle_writes": 2},
    ]
    ours, peer = spread.summarise(rows, COLUMNS)
    assert (ours["operator"], ours["runs"], peer["operator"]) == ("ours", 3, "peer")
    assert ours["figures"]["labelled_s"] == {"median": 1.1, "min": 1.0, "max": 1.4, "runs": 3}
    # a figure a run did not reach counts in none of its numbers, and the table says so
    assert peer["figures"]["join_p99_s"] == {"median": 1.0, "min": 1.0, "max": 1.0, "runs": 1}
    table = spread.summary_table(rows, COLUMNS).splitlines()
    assert table[2].split(" | ") == ["100", "ours", "3", "1.10 [1.00-1.40]", "0.250 [0.200-0.300]", "0 [0-0]"]
    assert table[3].split(" | ")[4] == "1.000 [1.000-1.000] (1 of 3)"


def test_a_count_whose_median_falls_between_two_runs_keeps_its_half() -> None:
    rows = [
        {"nodes": 1, "operator": "ours", "idle_writes": 0},
        {"nodes": 1, "operator": "ours", "idle_writes": 1},
    ]
    assert spread.summary_table(rows, COLUMNS).splitlines()[2].split(" | ")[-1] == "0.5 [0-1]"
