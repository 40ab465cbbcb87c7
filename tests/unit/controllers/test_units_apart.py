"""The units sit side by side, one folder each under controllers/units/ (the unit, its reconcile and
its pure rules): no module of a unit imports another unit's modules, its package included; what
they share (which policy is active, valid NVIDIADrivers, node routing, owners) comes from the read
model and its queries, and the shared machinery at controllers/'s root. The root reaches into no
unit but through the manager, which stays a registration list. The table of units is the folders."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

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


def _graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {name: references(name, path, known) - {name} for name, path in known.items()}


def test_every_unit_is_a_folder_the_manager_registers() -> None:
    known = modules()
    table = unit_table(known)
    assert len(table) >= 7, f"unit folders found: {sorted(table)}"
    loose = {m for m in known if m.startswith(U + ".")} - set().union(*table.values())
    assert loose == set(), f"a module under controllers/units/ outside a unit's folder: {sorted(loose)}"
    assert [u for u in sorted(table) if f"{u}.unit" not in known] == [], "each unit folder holds its unit.py"
    registered = {t for t in references(f"{C}.manager", known[f"{C}.manager"], known) if t in table}
    assert registered == set(table), "the manager registers each unit folder's unit, and only those"


def test_no_unit_imports_another_units_modules() -> None:
    known = modules()
    crossing = crossings(unit_table(known), _graph(known))
    assert crossing == [], "units import each other:\n" + "\n".join(crossing)


def test_the_root_reaches_into_no_unit_but_the_manager() -> None:
    known = modules()
    graph = _graph(known)
    inside = set().union(*unit_table(known).values())
    reaching = [f"{m} -> {t}" for m in sorted(known) if m.startswith(C + ".") and m not in inside
                and m != f"{C}.manager" for t in sorted(graph[m] & inside)]
    assert reaching == [], "the read side or shared machinery imports a unit (move what it needs to the root):\n" \
        + "\n".join(reaching)


def test_the_check_sees_a_crossing_import() -> None:
    table = {f"{U}.mig": {f"{U}.mig", f"{U}.mig.rules"}, f"{U}.labels": {f"{U}.labels", f"{U}.labels.nodelabels"}}
    graph = {f"{U}.labels.nodelabels": {f"{U}.mig.rules", f"{C}.queries"}, f"{U}.mig.rules": {f"{U}.mig"}}
    assert crossings(table, graph) == [f"{U}.labels.nodelabels -> {U}.mig.rules"]
    graph[f"{U}.mig.rules"].add(f"{U}.labels")  # a unit's package counts too
    assert crossings(table, graph) == [f"{U}.labels.nodelabels -> {U}.mig.rules", f"{U}.mig.rules -> {U}.labels"]


def test_the_manager_is_a_registration_list() -> None:
    path = Path(modules()[f"{C}.manager"])
    assert len(path.read_text().splitlines()) < 200
