"""The adaptive write limit (pure), the gate that applies it, and the labeller's promise: never
more patches than nodes whose labels must change."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status

from gpu_operator.controllers.pacing import AdaptiveGate, AdaptiveLimit
from gpu_operator.controllers.units.labels import labeller as labeller_module
from gpu_operator.controllers.units.labels.labeller import NodeLabeller
from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy, desired_change
from gpu_operator.controllers.views import NodeView
from gpu_operator.vocabulary import GPU_PRESENT


def test_slow_start_doubles_per_round_trip_while_latency_is_flat() -> None:
    limit = AdaptiveLimit(initial=4, maximum=64)
    for _ in range(4):  # one round trip at 4 in flight
        limit.record(0.01)
    assert limit.allowed == 8
    for _ in range(8):
        limit.record(0.01)
    assert limit.allowed == 16


def test_never_above_the_maximum_nor_below_the_minimum() -> None:
    limit = AdaptiveLimit(initial=4, minimum=2, maximum=10)
    for _ in range(1000):
        limit.record(0.01)
    assert limit.allowed == 10
    for _ in range(50):
        limit.record(0.01, 429)
    assert limit.allowed == 2


def test_overload_halves_at_once_and_ends_slow_start() -> None:
    limit = AdaptiveLimit(initial=32, maximum=64)
    limit.record(0.01, 429)
    assert limit.allowed == 16
    limit.record(0.01, 503)
    assert limit.allowed == 8
    before = limit.limit
    for _ in range(8):  # additive now: about +1 per round trip
        limit.record(0.01)
    assert before < limit.limit < before + 1.5


def test_latency_rise_shrinks_once_per_round_trip_but_not_below_the_start() -> None:
    limit = AdaptiveLimit(initial=4, maximum=64)
    for _ in range(60):
        limit.record(0.010)
    flat = limit.limit
    assert flat == 64
    for _ in range(10):
        limit.record(0.200)  # the apiserver slows down: 20x the baseline
    assert limit.limit < flat
    assert limit.limit >= flat * 0.9 - 1e-9  # once per round trip, not once per slow answer
    shrunk = limit.limit
    for _ in range(150):
        limit.record(0.200)
    assert limit.limit < shrunk
    for _ in range(2000):
        limit.record(0.400)
    assert limit.allowed >= 4  # a latency rise alone never goes below where it started


def test_starting_at_the_bound_a_latency_rise_stops_at_the_floor_and_overload_goes_below() -> None:
    limit = AdaptiveLimit(initial=32, maximum=32, floor=16)  # the node labeller's shape
    assert limit.allowed == 32
    limit.record(0.010)
    for _ in range(250):
        limit.record(0.400)  # 40x the baseline (while it is still in the window of 256 answers)
    assert limit.allowed == 16  # shrunk, to the floor and no lower
    limit.record(0.400, 429)
    assert limit.allowed == 8  # the apiserver refusing work halves it below the floor


def test_a_slower_machine_becomes_the_new_normal() -> None:
    limit = AdaptiveLimit(initial=8, maximum=64, window=100)
    for _ in range(50):
        limit.record(0.01)
    for _ in range(300):
        limit.record(0.05)  # permanently 5x slower: the old answers leave the window
    low = limit.limit
    for _ in range(200):
        limit.record(0.05)
    assert limit.limit > low  # growing again: the baseline followed


def test_refusals_do_not_grow_the_limit() -> None:
    limit = AdaptiveLimit(initial=4)
    for _ in range(20):
        limit.record(0.01, 403)
    assert limit.allowed == 4


class FakeKube:
    """Counts merge patches; answers 429 for the nodes named in `refuse`. The gate's bound is what
    is checked here, not API behaviour."""

    def __init__(self, refuse: set[str] | None = None) -> None:
        self.patches: list[str] = []
        self.in_flight = 0
        self.peak = 0
        self.refuse = refuse or set()

    async def merge_patch(
        self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        self.patches.append(name)
        if name in self.refuse:
            raise ApiError(status=Status(code=429, message="too many requests"))


def gpu_node(name: str, labelled: bool) -> NodeView:
    labels = {"feature.node.kubernetes.io/pci-10de.present": "true"}
    if labelled:
        labels = {**labels, GPU_PRESENT: "true"}
    return NodeView(name, labels, {}, "", "")


def test_one_patch_per_changed_node_and_the_gate_bounds_them() -> None:
    kube = FakeKube()
    labeller = NodeLabeller(kube, concurrency=8)  # type: ignore[arg-type]
    nodes = [gpu_node(f"n{i}", labelled=False) for i in range(300)]
    nodes += [gpu_node(f"done{i}", labelled=True) for i in range(300)]
    # A labelled node still lacks its deploy labels; only truly unchanged nodes are skipped.
    policy = LabelPolicy()
    wanted = {n.name for n in nodes if desired_change(n.labels, n.annotations, policy)}
    report = asyncio.run(labeller.label(nodes, policy))
    assert sorted(kube.patches) == sorted(wanted)  # one each, none for a node that matches
    assert len(set(kube.patches)) == len(kube.patches)
    assert kube.peak <= 8 and labeller.gate.peak <= 8
    assert sorted(report.patched) == sorted(wanted)


def test_the_first_patch_leaves_before_the_fleets_changes_are_all_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    computed: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        computed.append(args[-1])
        return desired_change(*args, **kwargs)

    class Recording(FakeKube):
        computed_at_first_patch: int | None = None

        async def merge_patch(
            self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None
        ) -> None:
            if self.computed_at_first_patch is None:
                self.computed_at_first_patch = len(computed)
            await super().merge_patch(api_version, kind, name, patch, namespace)

    monkeypatch.setattr(labeller_module, "desired_change", counting)
    kube = Recording()
    labeller = NodeLabeller(kube, concurrency=8)  # type: ignore[arg-type]
    asyncio.run(labeller.label([gpu_node(f"n{i}", labelled=False) for i in range(300)], LabelPolicy()))
    assert len(kube.patches) == 300 and len(computed) == 300
    assert kube.computed_at_first_patch is not None and kube.computed_at_first_patch <= 8


def test_a_failing_change_stops_the_pass_and_its_other_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> Any:
        if args[4] == "n40":  # desired_change(labels, annotations, policy, driver, node, gfd)
            raise ValueError("no change for n40")
        return desired_change(*args, **kwargs)

    async def run(kube: FakeKube) -> None:
        labeller = NodeLabeller(kube, concurrency=8)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="n40"):
            await labeller.label([gpu_node(f"n{i}", labelled=False) for i in range(300)], LabelPolicy())
        sent = len(kube.patches)
        await asyncio.sleep(0.05)  # no worker of the failed pass goes on patching
        assert len(kube.patches) == sent < 300

    monkeypatch.setattr(labeller_module, "desired_change", failing)
    asyncio.run(run(FakeKube()))


def test_nothing_to_change_sends_nothing() -> None:
    kube = FakeKube()
    labeller = NodeLabeller(kube, concurrency=8)  # type: ignore[arg-type]
    policy = LabelPolicy()
    node = NodeView("plain", {}, {}, "", "")  # no GPU, no labels of ours
    assert not asyncio.run(labeller.label([node], policy)).patched
    assert kube.patches == []


def test_429_answers_shrink_the_gate() -> None:
    kube = FakeKube(refuse={f"n{i}" for i in range(0, 200, 2)})
    labeller = NodeLabeller(kube, concurrency=32)  # type: ignore[arg-type]
    allowed: list[int] = []
    labeller.gate.on_change = allowed.append  # every change of the limit, in order
    report = asyncio.run(labeller.label([gpu_node(f"n{i}", False) for i in range(200)], LabelPolicy()))
    assert len(report.failed) == 100 and {f.code for f in report.failed.values()} == {429}
    # halved on every 429: far below its start (where it ends depends on the order the answers
    # came back in, which the event loop decides: the run's lowest does not)
    assert min(allowed) <= 2  # a latency rise alone stops at 16 (the floor)


def test_gate_limit_follows_its_answers() -> None:
    async def run() -> AdaptiveGate:
        gate = AdaptiveGate(AdaptiveLimit(initial=2, maximum=16))

        async def one() -> None:
            async with gate.slot():
                await asyncio.sleep(0.001)

        await asyncio.gather(*(one() for _ in range(100)))
        return gate

    gate = asyncio.run(run())
    assert gate.in_flight == 0
    assert 2 < gate.peak <= 16
