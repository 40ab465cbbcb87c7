"""The units sit side by side: no unit imports another unit, and no reconciler a unit runs imports
another unit's reconciler; what they share (which policy is active, valid NVIDIADrivers, node
routing, owners) comes from the read model and its queries. The manager stays a registration list."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import modules, references

C = "gpu_operator.controllers"
# each unit, and the reconciler module it runs (the upgrade unit's: the upgrade steps and owners)
UNITS: dict[str, set[str]] = {
    f"{C}.units.clusterpolicy": {f"{C}.clusterpolicy"},
    f"{C}.units.nvidiadriver": {f"{C}.nvidiadriver"},
    f"{C}.units.gpucluster": {f"{C}.gpucluster"},
    f"{C}.units.upgrade": {f"{C}.upgrade", f"{C}.upgrade_owners"},
    f"{C}.units.labels": set(),
    f"{C}.units.health": {f"{C}.health_rules", f"{C}.health_machine", f"{C}.health_exec"},
    f"{C}.units.mig": {f"{C}.mig_rules"},
}


def test_every_unit_module_is_in_the_table() -> None:
    found = {m for m in modules() if m.startswith(f"{C}.units.")}
    assert found == set(UNITS), "a unit without an entry here (say which reconciler module it runs)"


def test_no_unit_or_its_reconciler_imports_another_units() -> None:
    known = modules()
    crossing = []
    for unit, own in UNITS.items():
        others = {m for other, theirs in UNITS.items() if other != unit for m in (other, *theirs)} - own
        for module in (unit, *own):
            crossing += [f"{module} -> {t}" for t in sorted(references(module, known[module], known) & others)]
    assert crossing == [], "units import each other:\n" + "\n".join(crossing)


def test_the_manager_is_a_registration_list() -> None:
    path = Path(modules()[f"{C}.manager"])
    assert len(path.read_text().splitlines()) < 200
