"""One loop shape for the level-based controllers: kick or requeue, coalesce, one pass; a failed
pass is logged, counted per loop and retried after the backoff, a success resets it; an idle
loop runs no pass."""

from __future__ import annotations

import asyncio
import dataclasses

from prometheus_client import REGISTRY

from gpu_operator.controllers.passloop import PassLoop
from gpu_operator.controllers.settings import Backoff, OperatorSettings

SETTINGS = dataclasses.replace(OperatorSettings(), coalesce=0.0, reconcile_backoff=Backoff(initial=0.01, cap=0.05))


def passes(loop: str, result: str) -> float:
    return REGISTRY.get_sample_value("gpu_operator_controller_passes_total", {"loop": loop, "result": result}) or 0.0


def test_a_pass_runs_again_at_its_requeue_without_a_kick() -> None:
    runs: list[float] = []

    async def one() -> float | None:
        runs.append(1)
        return 0.01

    async def main() -> None:
        loop = PassLoop("unit requeue", asyncio.Event(), one, SETTINGS)
        loop.kick.set()
        requeue, pause = await loop.step(None, 0.0)
        assert requeue == 0.01 and len(runs) == 1
        await loop.step(requeue, pause)  # no kick: the requeue time runs it
        assert len(runs) == 2

    asyncio.run(main())
    assert passes("unit requeue", "ok") == 2


def test_a_failed_pass_backs_off_is_counted_and_a_success_resets_it() -> None:
    outcomes = [RuntimeError("apiserver away"), RuntimeError("still away"), None]
    errors: list[BaseException] = []

    async def one() -> float | None:
        outcome = outcomes.pop(0)
        if outcome:
            raise outcome
        return None

    async def main() -> None:
        loop = PassLoop("unit failing", asyncio.Event(), one, SETTINGS, on_error=errors.append)
        loop.kick.set()
        first, _ = await loop.step(None, 0.0)
        second, _ = await loop.step(first, 0.0)
        assert (first, second) == (0.01, 0.02) and loop.failures == 2
        third, _ = await loop.step(second, 0.0)
        assert third is None and loop.failures == 0

    asyncio.run(main())
    assert [str(e) for e in errors] == ["apiserver away", "still away"]
    assert passes("unit failing", "error") == 2 and passes("unit failing", "ok") == 1


def test_an_idle_loop_runs_no_pass() -> None:
    ran: list[int] = []

    async def one() -> float | None:
        ran.append(1)
        return 5.0

    async def main() -> None:
        loop = PassLoop("unit idle", asyncio.Event(), one, SETTINGS, idle=lambda: True)
        loop.kick.set()
        assert await loop.step(None, 0.0) == (None, 0.0)

    asyncio.run(main())
    assert ran == [] and passes("unit idle", "ok") == 0
