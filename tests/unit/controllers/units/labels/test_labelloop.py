"""The labelling unit's serving promises: a lone node event is patched at once (no coalescing
window while idle), a node that changed while its own patch was in flight is looked at again, a
status-only event costs no second patch, and a patch that gets no answer is retried on that
node's backoff.

The fake apiserver applies each merge patch to the node views and sends the change back as the
Node watch would (the view replaced, the node marked dirty, the loop kicked), 10 ms after the
patch answers (for a held node, after the test releases it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from gpu_operator.controllers.customresources import CUSTOM_RESOURCES
from gpu_operator.controllers.loop import UnitLoop
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.labels.nodelabels import LabelPolicy
from gpu_operator.controllers.units.labels.unit import LabelUnit
from gpu_operator.controllers.views import ClusterPolicyView, NodeView
from gpu_operator.vocabulary import GPU_PRESENT

NFD_GPU = "feature.node.kubernetes.io/pci-10de.present"


class Cluster:
    """Node views, the dirty set and the kick the loop reads, and a fake apiserver that applies
    merge patches to the views (with their watch event) and records when each arrived."""

    def __init__(self, names: list[str]) -> None:
        self.views = {n: NodeView(n, {NFD_GPU: "true"}, {}, "", "") for n in names}
        self.unit: LabelUnit | None = None
        self.kick = asyncio.Event()
        self.patches: list[tuple[float, str, dict[str, Any]]] = []
        self.hold: dict[str, asyncio.Event] = {}
        self.fail_once: set[str] = set()

    @property
    def dirty(self) -> set[str]:
        """The unit's queue: what a Node watch event adds to."""
        assert self.unit is not None
        return self.unit.dirty

    def changed(self, name: str, labels: dict[str, str | None]) -> None:
        """A node event: the view after `labels` (None removes a key), as the watch delivers it."""
        view = self.views[name]
        merged = {k: v for k, v in {**view.labels, **labels}.items() if v is not None}
        self.views[name] = replace(view, labels=merged)
        self.dirty.add(name)
        self.kick.set()

    async def merge_patch(
        self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> None:
        self.patches.append((time.monotonic(), name, patch))
        if name in self.hold:
            await self.hold[name].wait()
        if name in self.fail_once:
            self.fail_once.discard(name)
            raise ConnectionResetError("connection reset by peer")
        # the watch event of this write comes a little after the answer (it may also come before)
        asyncio.get_running_loop().call_later(0.01, self.changed, name, patch["metadata"].get("labels", {}))

    def event(self, name: str, view: NodeView) -> None:
        """A watch event that replaces the node's view as given (no merge)."""
        self.views[name] = view
        self.dirty.add(name)
        self.kick.set()

    async def held_patch(self, name: str) -> asyncio.Event:
        """Take a label away from `name` and hold the patch that puts it back; set the returned
        event to let the patch answer."""
        self.hold[name] = release = asyncio.Event()
        self.changed(name, {GPU_PRESENT: None})
        await until(lambda: sum(1 for _, n, _ in self.patches if n == name) == 2)
        return release

    def loop(self, **settings: Any) -> LabelUnit:
        model = ReadModel(
            "gpu-operator",
            node_map=self.views,
            indices={row.index_id: {} for row in CUSTOM_RESOURCES},
        )
        unit = self.unit = LabelUnit(self, OperatorSettings(**settings), model)  # type: ignore[arg-type]
        unit._wanted = lambda: LabelPolicy()  # type: ignore[method-assign]  # a ClusterPolicy with defaults
        return unit

    def runner(self, unit: LabelUnit) -> UnitLoop:
        """The loop every unit runs in (controllers/loop.py), kicked by this cluster's events."""
        return UnitLoop(unit, unit.settings.coalesce, unit.settings.label_backoff, kick=self.kick)


async def until(check: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def labelled(cluster: Cluster, name: str) -> bool:
    return cluster.views[name].labels.get(GPU_PRESENT) == "true"


async def started(cluster: Cluster, **settings: Any) -> tuple[LabelUnit, asyncio.Task[None]]:
    loop = cluster.loop(**settings)

    async def ready() -> None:
        return None

    task = asyncio.create_task(cluster.runner(loop).run(ready))
    cluster.kick.set()  # the first watch events
    # the first pass labels every node (a new policy): it waits the coalescing window first
    await until(
        lambda: all(labelled(cluster, n) for n in cluster.views), timeout=2.0 + loop.settings.coalesce
    )
    await asyncio.sleep(0.05)  # the echoes of the first pass are served
    return loop, task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_lone_join_is_patched_at_once_not_after_the_coalescing_window() -> None:
    async def run() -> float:
        cluster = Cluster(["n0"])
        begun = time.monotonic()
        _, task = await started(cluster, coalesce=1.5)  # a window a waiting loop could not hide
        assert cluster.patches[0][0] - begun >= 1.5  # the fleet-wide first pass did wait it
        await asyncio.sleep(0.2)  # idle
        cluster.views["n1"] = NodeView("n1", {NFD_GPU: "true"}, {}, "", "")
        joined = time.monotonic()
        cluster.dirty.add("n1")
        cluster.kick.set()
        await until(lambda: labelled(cluster, "n1"))
        took = next(t for t, name, _ in cluster.patches if name == "n1") - joined
        await stop(task)
        return took

    assert asyncio.run(run()) < 0.5


def test_a_node_that_changed_while_its_patch_was_in_flight_is_looked_at_again() -> None:
    async def run() -> None:
        cluster = Cluster(["n0"])
        _, task = await started(cluster)
        release = await cluster.held_patch("n0")
        # meanwhile the node lost its GPU (NFD label gone) and got its label back by hand: the
        # patch in flight no longer matches what the node needs
        cluster.hold.pop("n0")
        cluster.event("n0", replace(cluster.views["n0"], labels={GPU_PRESENT: "true"}))
        await asyncio.sleep(0.05)
        assert len(cluster.patches) == 2  # not patched twice at once
        release.set()
        await until(lambda: cluster.views["n0"].labels.get(GPU_PRESENT) == "false")
        assert len(cluster.patches) == 3  # the held one, then the one for what the node is now
        await stop(task)

    asyncio.run(run())


def test_a_patch_without_an_answer_is_retried_on_the_nodes_backoff() -> None:
    async def run() -> None:
        cluster = Cluster(["n0"])
        loop, task = await started(cluster)
        cluster.fail_once.add("n0")
        cluster.changed("n0", {GPU_PRESENT: None})
        await until(lambda: labelled(cluster, "n0"), timeout=5.0)  # the retry, after ~1 s
        attempts = [t for t, name, _ in cluster.patches if name == "n0"][1:]
        assert len(attempts) == 2 and attempts[1] - attempts[0] >= 0.9
        assert not loop.retries.failures
        await stop(task)

    asyncio.run(run())


def test_a_status_update_during_the_patch_costs_no_second_patch() -> None:
    async def run() -> None:
        cluster = Cluster(["n0"])
        _, task = await started(cluster)
        release = await cluster.held_patch("n0")
        # the kubelet (kwok) reports the node Ready while the patch is in flight: labels unchanged
        cluster.event("n0", replace(cluster.views["n0"], ready=True))
        await asyncio.sleep(0.05)
        release.set()
        await until(lambda: labelled(cluster, "n0"))
        await asyncio.sleep(0.1)  # the echo and any recheck are served
        assert len(cluster.patches) == 2
        await stop(task)

    asyncio.run(run())


def policy_view(generation: int = 1) -> ClusterPolicyView:
    return ClusterPolicyView("cluster-policy", "uid-1", generation, "2026-01-01T00:00:00Z", {})


def test_a_new_policys_reconcile_waits_for_its_fleet_wide_labelling_pass() -> None:
    """Labels first: `labelling()` holds the reconcile (and the DaemonSets it would create) until
    the loop has looked at this policy version and its fleet-wide pass has ended."""

    async def run() -> None:
        cluster = Cluster(["n0", "n1"])
        loop = cluster.loop()
        active = policy_view()

        def wanted() -> LabelPolicy:
            loop._looking = (active.uid, active.generation)
            return LabelPolicy()

        loop._wanted = wanted  # type: ignore[method-assign]
        assert loop.labelling(active)  # not looked at yet
        release = cluster.hold["n1"] = asyncio.Event()

        async def ready() -> None:
            return None

        task = asyncio.create_task(cluster.runner(loop).run(ready))
        cluster.kick.set()
        await until(lambda: any(name == "n1" for _, name, _ in cluster.patches))
        assert loop.labelling(active)  # the fleet-wide pass is still patching n1
        release.set()
        await until(lambda: not loop.labelling(active))
        await until(lambda: labelled(cluster, "n0") and labelled(cluster, "n1"))  # the watch echoes
        # a status-only update keeps the generation: nothing to wait for; a spec change does wait
        assert not loop.labelling(replace(active, body={"status": {"state": "ready"}}))
        assert loop.labelling(policy_view(generation=2))
        await stop(task)

    asyncio.run(run())


def test_a_labelling_loop_that_never_gets_there_holds_the_reconcile_only_up_to_the_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Cluster(["n0"]).loop(labels_first_limit=0.05)
    active = policy_view()
    assert loop.labelling(active)
    time.sleep(0.06)
    assert not loop.labelling(active) and not loop.labelling(active)
    warnings = [r.getMessage() for r in caplog.records if "still being labelled" in r.getMessage()]
    assert warnings == [
        "ClusterPolicy cluster-policy: its nodes are still being labelled after 0 s; reconciling anyway"
    ]
    assert not loop.labelling(None)
