"""The units sit side by side, one folder each under controllers/units/ (the unit, its reconcile and
its pure rules): no module of a unit imports another unit's modules, its package included; what
they share (which policy is active, valid NVIDIADrivers, node routing, owners) comes from the read
model and its queries, and the shared machinery at controllers/'s root. The root reaches into no
unit but through the registry (controllers/units/__init__.py: `units`, each folder's `build`, which
the manager runs; `take_backs`, each unit folder's takeback.py), through which alone
`gpu-operator cleanup` (admin/cleanup.py) reaches the units. The table of units is the folders:
the registry names none of them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from gpu_operator.kube.client import Kube
from tests.support.imports import modules, references

C = "gpu_operator.controllers"
U = f"{C}.units"


def unit_table(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Each package under controllers/units/ is a unit; every module under it is its own."""
    folder = known[U].parent
    units = {f"{U}.{p.name}" for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return {unit: {m for m in known if m == unit or m.startswith(unit + ".")} for unit in units}


def crossings(table: Mapping[str, set[str]], graph: Mapping[str, set[str]]) -> list[str]:
    """`module -> target` for each import of a unit's module that names another unit's module."""
    found = []
    for unit, own in sorted(table.items()):
        others = set().union(*(theirs for other, theirs in table.items() if other != unit))
        for module in sorted(own):
            found += [f"{module} -> {t}" for t in sorted(graph.get(module, set()) & others)]
    return found


def reaching(sources: set[str], inside: set[str], graph: Mapping[str, set[str]]) -> list[str]:
    """`module -> target` for each import of a module in `sources` that names a module in `inside`."""
    return [f"{m} -> {t}" for m in sorted(sources) for t in sorted(graph.get(m, set()) & inside)]


def _graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {name: references(name, path, known) - {name} for name, path in known.items()}


class NoKube:
    """The Manager's constructor reads only these; nothing here reaches an apiserver."""

    http: Any = None
    streams: Any = None
    statuses_written: dict[Any, Any] = {}


def test_every_unit_is_a_folder_the_manager_builds() -> None:
    from gpu_operator.controllers.environment import Environment
    from gpu_operator.controllers.manager import Manager
    from gpu_operator.controllers.units import unit_folders

    known = modules()
    table = unit_table(known)
    assert len(table) >= 7, f"unit folders found: {sorted(table)}"
    assert sorted(table) == [f"{U}.{name}" for name in unit_folders()]
    loose = {m for m in known if m.startswith(U + ".")} - set().union(*table.values())
    assert loose == set(), f"a module under controllers/units/ outside a unit's folder: {sorted(loose)}"
    assert [u for u in sorted(table) if f"{u}.unit" not in known] == [], "each unit folder holds its unit.py"
    manager = Manager(cast(Kube, NoKube()), Environment("gpu-operator"))
    built = sorted(type(loop.unit).__module__.rsplit(".", 1)[0] for loop in manager.loops)
    assert built == sorted(table), "the manager runs one unit of each folder's, and only those"
    named = {t for t in references(f"{C}.manager", known[f"{C}.manager"], known) if t.startswith(U + ".")}
    assert named == set(), "the manager names no unit: the registry builds them from the folders"


def test_no_unit_imports_another_units_modules() -> None:
    known = modules()
    crossing = crossings(unit_table(known), _graph(known))
    assert crossing == [], "units import each other:\n" + "\n".join(crossing)


def test_the_root_reaches_into_no_unit_but_the_manager() -> None:
    known = modules()
    graph = _graph(known)
    inside = set().union(*unit_table(known).values())
    root = {m for m in known if m.startswith(C + ".") and m not in inside} - {U}
    found = reaching(root, inside, graph)
    assert found == [], (
        "the read side or shared machinery imports a unit (move what it needs to the root):\n"
        + "\n".join(found)
    )


def _take_back_modules(table: Mapping[str, set[str]]) -> dict[str, str]:
    """Each unit folder's takeback.py: module -> its unit."""
    return {m: unit for unit, own in table.items() for m in own if m == f"{unit}.takeback"}


def test_each_take_back_step_is_a_unit_folders_and_each_folders_is_registered() -> None:
    """The registry (controllers/units/__init__.py) holds each takeback.py's `take_back` once and
    names no unit (it imports the folders by name); node labelling's step runs last (it takes the
    annotations that the other steps read: whose cordon it is)."""
    from gpu_operator.controllers.units import take_backs

    known = modules()
    table = unit_table(known)
    folders = _take_back_modules(table)
    steps = take_backs()
    registered = [f"{step.__module__}.{step.__name__}" for step in steps]
    assert sorted(registered) == sorted(f"{m}.take_back" for m in folders), (
        "take_backs() lists each unit folder's takeback.take_back, once, and nothing else"
    )
    assert registered[-1] == f"{U}.labels.takeback.take_back"
    assert set(reaching({U}, set().union(*table.values()), _graph(known))) == set()


def test_the_add_a_unit_checklist_names_takeback() -> None:
    """docs/architecture.md's "A unit" checklist says where a unit's take-back step goes."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "architecture.md").read_text()
    checklist = text.split("**A unit watching a new CR of ours**", 1)[1].split("**An operand state**", 1)[0]
    assert "controllers/units/<name>/takeback.py" in checklist and "take_backs()" in checklist


# What an admin command may import of a unit besides the take-back registry: the unit's own patch or
# decision the command applies by hand. Anything else of a unit's (a cleanup step) goes through the
# registry, so a new unit is taken back by adding its takeback.py, not by editing admin/.
ADMIN_INTO_UNITS = {
    "gpu_operator.admin.diff": {f"{U}.clusterpolicy.reconcile"},  # what the reconcile would render
    "gpu_operator.admin.health_cli": {f"{U}.health.machine"},  # `health retry`/`hold`: the machine's patches
    "gpu_operator.admin.upgrade_cli": {f"{U}.upgrade.state"},  # `upgrade retry`: the state machine's patch
}


def admin_crossings(graph: Mapping[str, set[str]], admin: set[str], inside: set[str]) -> list[str]:
    """`module -> target` for each import of a unit's module by an admin command beyond
    ADMIN_INTO_UNITS (the registry, controllers/units/__init__.py, is no unit's module)."""
    return [
        line for m in sorted(admin) for line in reaching({m}, inside - ADMIN_INTO_UNITS.get(m, set()), graph)
    ]


def test_admin_reaches_the_units_only_through_the_take_back_registry() -> None:
    known = modules()
    graph = _graph(known)
    table = unit_table(known)
    inside = set().union(*table.values())
    admin = {m for m in known if m.startswith("gpu_operator.admin.")}
    found = admin_crossings(graph, admin, inside)
    assert found == [], (
        "an admin command imports a unit's module (a take-back step: the unit's takeback.py, "
        "registered in controllers/units/__init__.py):\n" + "\n".join(found)
    )
    assert f"{U}" in graph["gpu_operator.admin.cleanup"], "cleanup runs the registry"
    stale = {m: t - graph.get(m, set()) for m, t in ADMIN_INTO_UNITS.items() if t - graph.get(m, set())}
    assert stale == {}, "ADMIN_INTO_UNITS names imports that are gone"


def test_the_admin_check_sees_a_direct_import_of_a_units_module() -> None:
    inside = {f"{U}.mig.unit", f"{U}.health.dra", f"{U}.health.machine"}
    graph = {
        "gpu_operator.admin.cleanup": {U, f"{C}.cleanup"},
        "gpu_operator.admin.health_cli": {f"{U}.health.machine"},
    }
    assert admin_crossings(graph, set(graph), inside) == []
    graph["gpu_operator.admin.cleanup"].add(f"{U}.mig.unit")  # planted: cleanup takes MIG's step back itself
    graph["gpu_operator.admin.health_cli"].add(f"{U}.health.dra")
    assert admin_crossings(graph, set(graph), inside) == [
        f"gpu_operator.admin.cleanup -> {U}.mig.unit",
        f"gpu_operator.admin.health_cli -> {U}.health.dra",
    ]


def test_the_check_sees_a_crossing_import() -> None:
    table = {
        f"{U}.mig": {f"{U}.mig", f"{U}.mig.rules"},
        f"{U}.labels": {f"{U}.labels", f"{U}.labels.nodelabels"},
    }
    graph = {f"{U}.labels.nodelabels": {f"{U}.mig.rules", f"{C}.queries"}, f"{U}.mig.rules": {f"{U}.mig"}}
    assert crossings(table, graph) == [f"{U}.labels.nodelabels -> {U}.mig.rules"]
    graph[f"{U}.mig.rules"].add(f"{U}.labels")  # a unit's package counts too
    assert crossings(table, graph) == [
        f"{U}.labels.nodelabels -> {U}.mig.rules",
        f"{U}.mig.rules -> {U}.labels",
    ]


def test_the_manager_is_a_registration_list() -> None:
    path = Path(modules()[f"{C}.manager"])
    assert len(path.read_text().splitlines()) < 200
