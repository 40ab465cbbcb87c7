"""A new unit watching a new CR of ours takes its hand-edited files alone (docs/architecture.md,
"Growing it"): a made-up api module that sets `CRD`, a row (what controllers/customresources.py's
one line would hold) and a made-up unit folder with a takeback.py are picked up with no other edit:
the CRD generator writes its CRD, the chart's rules grant it from that file, the Manager builds the
unit and hands it its row's events, `gpu-operator cleanup` runs its take-back step before node
labelling's, and the docs' lists of units go stale until `tools/unitdocs.py` is run. (The row's
watch, index and reads: tests/unit/controllers/test_custom_resource_row.py.)"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import helm_python
import pytest
from tools import unitdocs

import gpu_operator.api
import gpu_operator.controllers.units
from gpu_operator.api import crdgen
from gpu_operator.controllers import customresources
from gpu_operator.controllers.customresources import CustomResource, plain_view
from gpu_operator.controllers.environment import Environment
from gpu_operator.controllers.loop import EventKind, ObjectEvent
from gpu_operator.controllers.manager import Manager
from gpu_operator.controllers.units import take_backs, unit_folders
from gpu_operator.kube.client import Kube
from tests.support.chart import CHART, find, render_chart

API = """
from pydantic import BaseModel

from gpu_operator.api.crdrow import CRDRow

GROUP = "nvidia.com"
VERSION = "v1alpha1"
KIND = "Widget"
PLURAL = "widgets"


class WidgetSpec(BaseModel):
    size: int = 1


class WidgetStatus(BaseModel):
    state: str = ""


class Widget(BaseModel):
    spec: WidgetSpec = WidgetSpec()


CRD = CRDRow(WidgetSpec, WidgetStatus)
"""

UNIT = """
from gpu_operator.controllers.customresources import WIDGETS
from gpu_operator.controllers.loop import Event, ObjectEvent, Result, UnitBase
from gpu_operator.controllers.unitparts import UnitParts


class WidgetUnit(UnitBase):
    name = "widgets"

    def wants(self, event: Event) -> bool:
        return isinstance(event, ObjectEvent) and event.of(WIDGETS)

    async def reconcile(self) -> Result:
        return Result()


def build(parts: UnitParts) -> WidgetUnit:
    return WidgetUnit()
"""

TAKEBACK = """
async def take_back(uninstall) -> list[str]:
    return []
"""


class NoKube:
    http: Any = None
    streams: Any = None
    statuses_written: dict[Any, Any] = {}


@pytest.fixture
def widgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CustomResource[Any]]:
    """The made-up files where a newcomer would write them (an extra folder on each package's
    path), and the row (customresources.py's one line) on its module."""
    api = tmp_path / "api"
    api.mkdir()
    (api / "widgetapi.py").write_text(textwrap.dedent(API))
    unit = tmp_path / "units" / "widgets"
    unit.mkdir(parents=True)
    (unit / "__init__.py").write_text(textwrap.dedent(UNIT))
    (unit / "takeback.py").write_text(textwrap.dedent(TAKEBACK))
    monkeypatch.setattr(gpu_operator.api, "__path__", [*gpu_operator.api.__path__, str(api)])
    units = gpu_operator.controllers.units
    monkeypatch.setattr(units, "__path__", [*units.__path__, str(unit.parent)])
    from gpu_operator.api import widgetapi  # type: ignore[attr-defined]

    row = CustomResource(
        widgetapi.GROUP, widgetapi.VERSION, widgetapi.PLURAL, widgetapi.KIND, plain_view(widgetapi.Widget)
    )
    monkeypatch.setattr(customresources, "WIDGETS", row, raising=False)
    yield row
    import sys

    for name in (
        "gpu_operator.api.widgetapi",
        f"{units.__name__}.widgets",
        f"{units.__name__}.widgets.takeback",
    ):
        sys.modules.pop(name, None)


def test_its_crd_is_generated_and_the_chart_grants_it(widgets: CustomResource[Any], tmp_path: Path) -> None:
    generated = crdgen.crds()
    assert "nvidia.com_widgets.yaml" in generated
    assert crdgen.stale([crdgen.chart_dir(CHART.parents[1])]) == [CHART / "crds" / "nvidia.com_widgets.yaml"]
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    crdgen.write([chart / "crds"])
    with helm_python.Chart.load(chart) as loaded:
        rendered = render_chart(chart=loaded)
    for role in ("gpu-operator", "gpu-operator-cleanup"):
        ours = [r for r in find(rendered, "ClusterRole", role)["rules"] if r["apiGroups"] == ["nvidia.com"]]
        assert "widgets" in ours[0]["resources"], role
    operator = find(rendered, "ClusterRole")["rules"]
    granted = {
        resource for rule in operator if rule["apiGroups"] == ["nvidia.com"] for resource in rule["resources"]
    }
    assert {"widgets/status", "widgets/finalizers"} <= granted


def test_the_manager_builds_its_unit_and_hands_it_its_rows_events(widgets: CustomResource[Any]) -> None:
    assert "widgets" in unit_folders()
    manager = Manager(cast(Kube, NoKube()), Environment("gpu-operator"))
    event = ObjectEvent(EventKind.CUSTOM_RESOURCE, resource=widgets)
    assert [loop.name for loop in manager.loops if loop.unit.wants(event)] == ["widgets"]


def test_cleanup_runs_its_take_back_step_before_node_labellings(widgets: CustomResource[Any]) -> None:
    steps = [step.__module__ for step in take_backs()]
    units = gpu_operator.controllers.units.__name__
    assert f"{units}.widgets.takeback" in steps
    assert steps[-1] == f"{units}.labels.takeback"


def test_the_docs_lists_of_units_go_stale_until_the_command_is_run(widgets: CustomResource[Any]) -> None:
    assert ("widgets", "widgets", True) in unitdocs.units()
    assert sorted(unitdocs.stale()) == ["README.md", "docs/architecture.md", "docs/operator.md"]
