"""A SIGTERM stops every task of the operator at once: kopf installs its own SIGTERM/SIGINT
handlers when it starts (they stop kopf only, then kopf waits 5 s for the tasks it did not start
and cancels them), so the operator takes the signals back once kopf has started; and the Node
watch, which waits on its stream for minutes between events, ends as soon as `stop` is set."""

from __future__ import annotations

import asyncio
import os
import signal

from gpu_operator.controllers.reflector import NodeReflector
from gpu_operator.controllers.run import take_signals
from gpu_operator.kube import slimwatch


def test_the_signals_are_taken_back_from_a_handler_installed_after_ours() -> None:
    async def scenario() -> tuple[bool, list[str]]:
        stop = asyncio.Event()
        theirs: list[str] = []
        loop = asyncio.get_running_loop()
        take_signals(stop)
        loop.add_signal_handler(signal.SIGTERM, theirs.append, "kopf")  # as kopf does at its start
        take_signals(stop)  # what the manager calls once kopf has started
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.wait(), 5)
            return stop.is_set(), theirs
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    assert asyncio.run(scenario()) == (True, [])


def test_the_node_watch_ends_when_stop_is_set_while_it_waits_on_its_stream() -> None:
    async def scenario() -> tuple[list[str], bool]:
        calls: list[str] = []
        cancelled = asyncio.Event()
        reflector = NodeReflector(None, None, lambda name, view: None)  # type: ignore[arg-type]

        async def listed() -> str:
            calls.append("list")
            reflector.synced.set()
            return "1"

        async def waits_forever() -> None:
            calls.append("watch")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        reflector.list = listed  # type: ignore[method-assign]
        reflector.watch = waits_forever  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(reflector.run(stop))
        await reflector.synced.wait()
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 5)
        return calls, cancelled.is_set()

    assert asyncio.run(scenario()) == (["list", "watch"], True)


def test_unless_stopped_returns_the_work_and_raises_its_error() -> None:
    async def ok() -> None:
        await asyncio.sleep(0)

    async def fails() -> None:
        raise ValueError("broken stream")

    async def scenario() -> tuple[bool, str]:
        stop = asyncio.Event()
        done = await slimwatch._unless_stopped(ok(), stop)
        try:
            await slimwatch._unless_stopped(fails(), stop)
        except ValueError as err:
            return done, str(err)
        return done, ""

    assert asyncio.run(scenario()) == (True, "broken stream")


def test_the_units_are_cancelled_when_stop_is_set_while_they_wait_for_a_kick() -> None:
    from gpu_operator.controllers.manager import cancel_at_stop

    async def scenario() -> list[bool]:
        stop, kick = asyncio.Event(), asyncio.Event()

        async def unit() -> None:  # as UnitLoop.step waits: for a kick or its requeue
            await asyncio.wait_for(kick.wait(), timeout=600)

        units = [asyncio.create_task(unit()) for _ in range(3)]
        watcher = asyncio.create_task(cancel_at_stop(stop, units))
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*units, return_exceptions=True), 5)
        await watcher
        return [u.cancelled() for u in units]

    assert asyncio.run(scenario()) == [True, True, True]
