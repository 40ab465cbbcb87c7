"""What a controller of the operator is, and the one loop that runs each.

A unit (controllers/units/) is one level-based controller. It declares the events that concern
it (`wants`: it records what it needs, e.g. the nodes to look at, and answers whether to kick
it), its pacing, and one pass (`reconcile`) that returns a `Result`. It owns its queue: the kick
flag here and whatever it recorded in `wants`. The manager (controllers/manager.py) only
registers units and hands every watch event to every unit; it knows nothing of what they do.

`UnitLoop` runs one unit: wait for a kick or the requeue time, pace, one pass; a pass that raises
is logged, counted and retried after the unit's backoff, reset by a success. Pacing:

- `Pacing.LOAD` (the reconcilers): every pass starts after the coalescing window, and the next
  waits at least twice as long as the last one took: node events come in bursts (labelling a
  thousand nodes answers with a thousand events), and a full pass per event would starve the
  labeller on the same event loop.
- `Pacing.IDLE_FIRST` (node labelling, health): served at once while the loop is idle; only under
  load does the next pass wait, up to twice as long as the last one took and at most the window,
  so a lone node's change is written right away while a thousand echoes share a few passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter, Gauge

from gpu_operator.controllers.leader import log_pass_failure
from gpu_operator.controllers.settings import Backoff

if TYPE_CHECKING:
    from gpu_operator.controllers.customresources import CustomResource
    from gpu_operator.controllers.views import NodeView

log = logging.getLogger("gpu_operator.controllers")

PASSES = Counter(
    "gpu_operator_controller_passes",
    "Passes of each controller loop, by result (ok, error)",
    ["loop", "result"],
)
PASS_SECONDS = Gauge(
    "gpu_operator_controller_pass_duration_seconds", "How long each loop's last pass took", ["loop"]
)


@dataclass
class Result:
    """What every pass returns: when the unit wants to run again without a kick (seconds; None:
    at the next kick). Units' reports (what a pass wrote, for logs, metrics and tests) extend it."""

    requeue: float | None = None
    # How long the pass worked, where it also waited on purpose (a fleet-wide labelling pass waits
    # the coalescing window first): pacing counts the work only. None: the pass's wall time.
    busy: float | None = field(default=None, kw_only=True)


# -- the events a unit may want -------------------------------------------------------------------


@dataclass(frozen=True)
class NodeEvent:
    """The Node reflector saw `name` appear, change what we read of it (`view`: the new view), or
    go (`view` None). A unit that needs the change itself keeps what it saw last (the upgrade
    unit does)."""

    name: str
    view: NodeView | None


class EventKind(enum.Enum):
    # one of our CRs (controllers/customresources.py): the event's `resource` says which
    CUSTOM_RESOURCE = "custom resource"
    OWNED = "owned"  # an object of a kind the operator owns (DaemonSets, ConfigMaps ...)
    DRIVER_POD = "driver pod"
    GFD_FEATURES = "GFD NodeFeature"
    PLUGIN_CONFIG = (
        "devicePlugin.config ConfigMap"  # the user's ConfigMap the plugins read (kube/configwatch.py)
    )


@dataclass(frozen=True)
class ObjectEvent:
    """An object of `kind` changed (our own status echoes are not events). `node`: the node it
    concerns (a driver pod's, a NodeFeature's), where there is one; `resource`: the row of the CR
    of a CUSTOM_RESOURCE event (and only of one), so a new CR needs no new kind."""

    kind: EventKind
    node: str | None = None
    resource: CustomResource[Any] | None = None

    def __post_init__(self) -> None:
        if (self.kind is EventKind.CUSTOM_RESOURCE) is (self.resource is None):
            raise ValueError(f"{self.kind}: a resource row with a CUSTOM_RESOURCE event, and only then")

    def of(self, *resources: CustomResource[Any]) -> bool:
        """An event of one of these CRs (a unit's `wants` names the rows it reads)."""
        return self.resource is not None and self.resource in resources


Event = NodeEvent | ObjectEvent


@dataclass
class NodeQueue:
    """A unit's queue of nodes: a node goes in when what the unit reads of it (`facts` of its view)
    changed since its last event, so an event that changed nothing the unit reads (a heartbeat, the
    echo of another unit's write) costs one comparison."""

    facts: Callable[[NodeView], object]
    dirty: set[str] = field(default_factory=set)
    seen: dict[str, object] = field(default_factory=dict)

    def changed(self, event: NodeEvent) -> bool:
        """Record a node event; True when the node's facts changed (it is queued). A deleted node
        is forgotten, not queued: the unit decides what a deletion means to it."""
        if event.view is None:
            self.seen.pop(event.name, None)
            return False
        facts = self.facts(event.view)
        if self.seen.get(event.name) == facts:
            return False
        self.seen[event.name] = facts
        self.dirty.add(event.name)
        return True

    def take(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    async def each(
        self,
        names: Iterable[str],
        limit: int,
        work: Callable[[str], Awaitable[None]],
        report: NodePass,
        what: str,
        logger: logging.Logger,
    ) -> None:
        """Run `work` for each node, at most `limit` at once; a node whose work raises is logged,
        named in `report.failed` and queued again: one node's failure never stops the others.
        `limit` workers take the nodes in turn, each letting the event loop run between two nodes:
        a pass over 5,000 nodes that write nothing neither builds 5,000 tasks nor holds the loop
        (0.2 s at once, measured, when it did)."""
        todo = iter(sorted(names))

        async def worker() -> None:
            for name in todo:
                try:
                    await work(name)
                except Exception as err:
                    logger.warning("node %s: %s: %s", name, what, err)
                    report.failed.append(name)
                    self.dirty.add(name)
                await asyncio.sleep(0)

        await asyncio.gather(*(worker() for _ in range(max(1, limit))))


@dataclass
class NodePass(Result):
    """What a pass over nodes wrote (the per-node units' reports extend it; for logs and tests)."""

    looked: int = 0
    conditions: int = 0
    events: int = 0
    failed: list[str] = field(default_factory=list)


class Pacing(enum.Enum):
    LOAD = "load"
    IDLE_FIRST = "idle-first"


class Unit(Protocol):
    """One controller. `name` labels its metrics and logs."""

    name: str
    pacing: Pacing

    def wants(self, event: Event) -> bool:
        """Record what `event` means for this unit; True: kick it."""
        ...

    async def reconcile(self) -> Result:
        """One level-based pass over what it recorded (and whatever else it reads)."""
        ...

    def idle(self) -> bool:
        """Nothing to do now (e.g. no NVIDIADriver): the pass is skipped until the next kick."""
        ...

    def failed(self, err: BaseException) -> None:
        """A pass raised (after it was logged and counted): e.g. put its work back."""
        ...


class UnitBase:
    """Defaults for the optional parts of `Unit`."""

    pacing = Pacing.LOAD
    backoff: Backoff | None = None  # a failed pass's retries; None: the settings' reconcile backoff

    def idle(self) -> bool:
        return False

    def failed(self, err: BaseException) -> None:
        return None

    def holds_back(self) -> bool:
        """Whether the units built with `labels_first` (controllers/unitparts.py) wait on this one
        now: node labelling while a new ClusterPolicy's labels are written."""
        return False


@dataclass
class UnitLoop:
    unit: Unit
    coalesce: float
    backoff: Backoff
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    failures: int = 0
    _quiet_from: float = 0.0  # IDLE_FIRST: the next pass starts no earlier than this

    @property
    def name(self) -> str:
        return self.unit.name

    def offer(self, event: Event) -> None:
        if self.unit.wants(event):
            self.kick.set()

    async def step(self, requeue: float | None, pause: float) -> tuple[float | None, float]:
        """One wait + pass; returns the next (requeue, pause)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.kick.wait(), timeout=requeue)
        if self.unit.pacing is Pacing.IDLE_FIRST:
            pause = self._quiet_from - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        self.kick.clear()
        if self.unit.idle():
            return None, self.coalesce
        started = time.monotonic()
        try:
            result = await self.unit.reconcile()
        except Exception as err:  # keep serving: the next kick or the backoff retries
            self.failures += 1
            retry = self.backoff.delay(self.failures)
            log_pass_failure(log, f"{self.name} failed ({err})", self.failures, retry)
            PASSES.labels(self.name, "error").inc()
            self.unit.failed(err)
            self._quiet_from = time.monotonic() + retry
            return retry, self.coalesce
        ended = time.monotonic()
        took = result.busy if result.busy is not None else ended - started
        self.failures = 0
        PASSES.labels(self.name, "ok").inc()
        PASS_SECONDS.labels(self.name).set(took)
        if self.unit.pacing is Pacing.IDLE_FIRST:
            self._quiet_from = ended + min(self.coalesce, 2 * took)
            return result.requeue, 0.0
        return result.requeue, max(self.coalesce, 2 * took)

    async def run(self, ready: Callable[[], Awaitable[None]]) -> None:
        await ready()
        requeue: float | None = None
        pause = self.coalesce
        while True:
            requeue, pause = await self.step(requeue, pause)
