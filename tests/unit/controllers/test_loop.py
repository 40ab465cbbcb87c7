"""One loop for every unit: kick or requeue, pace, one pass; a failed pass is logged, counted per
unit and retried after the unit's backoff, a success resets it; an idle unit runs no pass; a
unit is kicked only by the events it wants."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import REGISTRY

from gpu_operator.controllers.loop import (
    Event,
    EventKind,
    NodeEvent,
    NodePass,
    NodeQueue,
    ObjectEvent,
    Pacing,
    Result,
    UnitBase,
    UnitLoop,
)
from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.views import NodeView

BACKOFF = Backoff(initial=0.01, cap=0.05)


def passes(loop: str, result: str) -> float:
    return (
        REGISTRY.get_sample_value("gpu_operator_controller_passes_total", {"loop": loop, "result": result})
        or 0.0
    )


class Scripted(UnitBase):
    """A unit whose passes return (or raise) what it is given, in turn."""

    def __init__(
        self,
        name: str,
        outcomes: list[float | None | Exception],
        *,
        idle: bool = False,
        pacing: Pacing = Pacing.LOAD,
        wants: Callable[[Event], bool] = lambda _e: True,
    ) -> None:
        self.name = name
        self.outcomes = outcomes
        self._idle = idle
        self.pacing = pacing
        self._wants = wants
        self.ran: list[float] = []
        self.errors: list[BaseException] = []

    def wants(self, event: Event) -> bool:
        return self._wants(event)

    def idle(self) -> bool:
        return self._idle

    def failed(self, err: BaseException) -> None:
        self.errors.append(err)

    async def reconcile(self) -> Result:
        self.ran.append(time.monotonic())
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return Result(outcome)


def test_a_pass_runs_again_at_its_requeue_without_a_kick() -> None:
    unit = Scripted("unit requeue", [0.01])

    async def main() -> None:
        loop = UnitLoop(unit, 0.0, BACKOFF)
        loop.kick.set()
        requeue, pause = await loop.step(None, 0.0)
        assert requeue == 0.01 and len(unit.ran) == 1
        await loop.step(requeue, pause)  # no kick: the requeue time runs it
        assert len(unit.ran) == 2

    asyncio.run(main())
    assert passes("unit requeue", "ok") == 2


def test_a_failed_pass_backs_off_is_counted_and_a_success_resets_it() -> None:
    unit = Scripted("unit failing", [RuntimeError("apiserver away"), RuntimeError("still away"), None])

    async def main() -> None:
        loop = UnitLoop(unit, 0.0, BACKOFF)
        loop.kick.set()
        first, _ = await loop.step(None, 0.0)
        second, _ = await loop.step(first, 0.0)
        assert (first, second) == (0.01, 0.02) and loop.failures == 2
        third, _ = await loop.step(second, 0.0)
        assert third is None and loop.failures == 0

    asyncio.run(main())
    assert [str(e) for e in unit.errors] == ["apiserver away", "still away"]
    assert passes("unit failing", "error") == 2 and passes("unit failing", "ok") == 1


def test_an_idle_unit_runs_no_pass() -> None:
    unit = Scripted("unit idle", [5.0], idle=True)

    async def main() -> None:
        loop = UnitLoop(unit, 0.0, BACKOFF)
        loop.kick.set()
        assert await loop.step(None, 0.0) == (None, 0.0)

    asyncio.run(main())
    assert unit.ran == [] and passes("unit idle", "ok") == 0


def test_a_unit_is_kicked_only_by_the_events_it_wants() -> None:
    unit = Scripted(
        "unit choosy", [None], wants=lambda e: isinstance(e, ObjectEvent) and e.kind is EventKind.OWNED
    )

    async def main() -> None:
        loop = UnitLoop(unit, 0.0, BACKOFF)
        loop.offer(NodeEvent("n1", NodeView("n1", {}, {}, "", "")))
        loop.offer(ObjectEvent(EventKind.DRIVER_POD, "n1"))
        assert not loop.kick.is_set()
        loop.offer(ObjectEvent(EventKind.OWNED))
        assert loop.kick.is_set()

    asyncio.run(main())


def test_load_pacing_waits_the_window_after_every_kick_idle_first_does_not() -> None:
    """LOAD: a kick is served after the coalescing window; IDLE_FIRST: at once while idle, and
    after a pass the next waits at most the window (twice the pass's time)."""
    window = 0.3

    async def first_pass_delay(pacing: Pacing) -> float:
        unit = Scripted(f"unit {pacing.value}", [None], pacing=pacing)
        loop = UnitLoop(unit, window, BACKOFF)
        loop.kick.set()
        kicked = time.monotonic()
        await loop.step(None, window)
        return unit.ran[0] - kicked

    assert asyncio.run(first_pass_delay(Pacing.LOAD)) >= window
    assert asyncio.run(first_pass_delay(Pacing.IDLE_FIRST)) < window


def test_a_node_pass_runs_every_node_within_its_limit_and_queues_a_failed_one_again() -> None:
    queue = NodeQueue(lambda view: view.labels)
    report = NodePass()
    running, most, done = 0, 0, []

    async def work(name: str) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        if name == "n2":
            raise RuntimeError("the apiserver said no")
        done.append(name)

    asyncio.run(
        queue.each({"n1", "n2", "n3", "n4"}, 2, work, report, "write failed", logging.getLogger("test"))
    )
    assert sorted(done) == ["n1", "n3", "n4"]  # one node's failure stops none of the others
    assert report.failed == ["n2"]
    assert queue.take() == {"n2"}  # looked at again at the next pass
    assert most == 2


def test_a_node_pass_that_writes_nothing_lets_the_event_loop_run_between_nodes() -> None:
    """5,000 nodes that need nothing (an everything-pass of GPU health or MIG repair) must not hold
    the event loop for the whole pass: another task runs after a few nodes, not after all."""
    queue = NodeQueue(lambda view: view.labels)
    order: list[str] = []
    first = asyncio.Event()

    async def work(name: str) -> None:  # decides, writes nothing: never suspends
        order.append(name)
        first.set()

    async def other() -> None:  # e.g. the labelling unit serving a join
        await first.wait()
        order.append("other")

    async def scenario() -> None:
        task = asyncio.create_task(other())
        await queue.each(
            {f"n{i:03}" for i in range(500)}, 4, work, NodePass(), "write failed", logging.getLogger("test")
        )
        await task

    asyncio.run(scenario())
    assert len(order) == 501
    assert order.index("other") <= 3 * 4  # within a few turns of the 4 workers (it was 500)
