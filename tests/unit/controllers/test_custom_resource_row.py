"""A watched custom resource is one row (controllers/customresources.py): a made-up kind, named
by its row alone and handed to the read model, is watched and indexed, read through the generic
accessor (the model's and a pass's snapshot's), and its events reach the unit that names its row
and no other. Nothing else names it: no index id, event kind, accessor or view class of its own."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import kopf
import pydantic
import pytest

from gpu_operator.controllers.customresources import (
    CLUSTER_POLICY,
    CUSTOM_RESOURCES,
    GPU_CLUSTER,
    NVIDIA_DRIVER,
    CustomResource,
    plain_view,
)
from gpu_operator.controllers.environment import Environment
from gpu_operator.controllers.loop import Event, EventKind, ObjectEvent, Result, UnitBase
from gpu_operator.controllers.manager import Manager
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.watches import Watches
from gpu_operator.kube.client import Kube


class WidgetSpec(pydantic.BaseModel):
    size: int = 1


class Widget(pydantic.BaseModel):
    """The made-up kind's api model (what api/ would hold)."""

    spec: WidgetSpec = WidgetSpec()


WIDGET = CustomResource("example.com", "v1beta1", "widgets", "Widget", plain_view(Widget))


def widget(name: str, size: int) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": WIDGET.api_version,
            "kind": WIDGET.kind,
            "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": "t"},
            "spec": {"size": size},
        }
    )


class WidgetUnit(UnitBase):
    """A unit of the made-up kind: it names the row in `wants` and reads it through the model."""

    name = "widgets"

    def __init__(self, model: ReadModel) -> None:
        self.model = model

    def wants(self, event: Event) -> bool:
        return isinstance(event, ObjectEvent) and event.of(WIDGET)

    async def reconcile(self) -> Result:
        return Result()


def handler(handlers: Any, resource: tuple[str, str, str]) -> Any:
    """The one kopf handler registered for `resource` (group, version, plural)."""
    group, version, plural = resource
    found = [
        h
        for h in handlers
        if (h.selector.group, h.selector.version, h.selector.any_name) == (group, version, plural)
    ]
    assert len(found) == 1, f"{resource}: {len(found)} handlers"
    return found[0]


def started(resources: tuple[CustomResource[Any], ...]) -> tuple[ReadModel, Watches, list[Event]]:
    events: list[Event] = []
    model = ReadModel("gpu-operator", resources=resources)
    watches = Watches(model, OperatorSettings(), events.append, lambda _: None, lambda: None)
    return model, watches, events


def test_a_new_row_is_watched_indexed_read_and_reaches_the_unit_that_wants_it() -> None:
    model, watches, events = started((*CUSTOM_RESOURCES, WIDGET))

    # watched and indexed: one index and one event handler on its resource, its row in `watched`
    assert WIDGET in watches.watched
    index = handler(watches.registry._indexing.get_all_handlers(), WIDGET.resource)
    assert index.id == WIDGET.index_id
    changed = handler(watches.registry._watching.get_all_handlers(), WIDGET.resource)

    # kopf's index function keeps the row's view; the startup handler takes the row's index
    body = widget("w1", 3)
    entry = asyncio.run(index.fn(body=body, name="w1"))
    stores: dict[str, Any] = {w.index_id: {} for w in watches.watched}
    stores[WIDGET.index_id] = {name: [view] for name, view in entry.items()}
    watches._configure(kopf.OperatorSettings(), **stores)

    # read through the generic accessor, typed by the row, parsed by its model
    (view,) = model.objects(WIDGET)
    assert type(view) is WIDGET.view and view.name == "w1"
    assert view.parsed.model == Widget(spec=WidgetSpec(size=3))
    assert model.snapshot().objects(WIDGET) == (view,)
    assert model.policies() == [] and model.snapshot().policies == ()

    # its event names its row and reaches the unit that names it, and none of the operator's units
    asyncio.run(changed.fn(body=body, type="ADDED"))
    assert events == [ObjectEvent(EventKind.CUSTOM_RESOURCE, resource=WIDGET)]
    assert WidgetUnit(model).wants(events[0])
    manager = Manager(cast(Kube, NoKube()), Environment("gpu-operator"), OperatorSettings())
    assert [loop.name for loop in manager.loops if loop.unit.wants(events[0])] == []


def test_our_rows_events_reach_the_units_that_name_them() -> None:
    """Behaviour kept: which of the operator's units each of our CRs' events kicks."""
    manager = Manager(cast(Kube, NoKube()), Environment("gpu-operator"), OperatorSettings())
    kicked = {
        row.kind: sorted(
            loop.name
            for loop in manager.loops
            if loop.unit.wants(ObjectEvent(EventKind.CUSTOM_RESOURCE, resource=row))
        )
        for row in CUSTOM_RESOURCES
    }
    reconcilers = [
        "ClusterPolicy reconcile",
        "GPUCluster reconcile",
        "NVIDIADriver reconcile",
        "driver upgrade pass",
        "node labelling",
    ]
    assert kicked == {
        CLUSTER_POLICY.kind: sorted([*reconcilers, "gpu health", "mig"]),
        NVIDIA_DRIVER.kind: reconcilers,
        GPU_CLUSTER.kind: sorted([*reconcilers, "gpu health"]),
    }


def test_without_the_row_nothing_of_the_kind_is_there() -> None:
    """The rows the model holds are what is watched: the default table has no widgets."""
    model, watches, _ = started(CUSTOM_RESOURCES)
    assert WIDGET.index_id not in {w.index_id for w in watches.watched}
    assert {w.index_id for w in watches.watched} >= {row.index_id for row in CUSTOM_RESOURCES}


def test_a_custom_resource_event_names_its_row_and_only_it_does() -> None:
    with pytest.raises(ValueError):
        ObjectEvent(EventKind.CUSTOM_RESOURCE)
    with pytest.raises(ValueError):
        ObjectEvent(EventKind.OWNED, resource=WIDGET)
    assert not ObjectEvent(EventKind.OWNED).of(*CUSTOM_RESOURCES)


class NoKube:
    """Nothing here may reach the apiserver: the units are only asked what they want."""

    http: Any = None
    streams: Any = None
    statuses_written: dict[Any, Any] = {}
