"""Facts the docs state about the code, held against the code: every repository path a page names
exists; the `loop` label values docs/operator.md lists are the units the Manager builds, and the
units README.md and docs/architecture.md list are the folders (generated: tools/unitdocs.py); the Settings table's defaults are the
code's; docs/architecture.md's golden-file figures are the tree's."""

from __future__ import annotations

import dataclasses
import glob
import re
from pathlib import Path
from typing import Any, cast

import yaml

from gpu_operator import shapes
from gpu_operator.controllers.environment import Environment
from gpu_operator.controllers.manager import Manager
from gpu_operator.controllers.settings import Backoff, OperatorSettings
from gpu_operator.kube.client import Kube
from tests.unit.docs.test_tables import tables

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "gpu_operator"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPERATOR_MD = ROOT / "docs" / "operator.md"
ARCHITECTURE_MD = ROOT / "docs" / "architecture.md"

# A path from the top of this repository (src/..., tests/..., docs/...), or a module path from the
# package's top (controllers/manager.py, render/states/data/mig-layouts.txt).
REPO_PATH = re.compile(r"(?<![\w./-])((?:src|tests|docs|bench|examples|deployments|tools)/[\w.*/-]*[\w*/])")
ROOMS = "|".join(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())
MODULE_PATH = re.compile(rf"(?<![\w./-])((?:{ROOMS})/[\w/-]*\w\.(?:py|txt|yaml|json))\b")
# Paths in other repositories that the docs cite as sources, with the repository each lies in.
UPSTREAM = {
    "src/nvidia/src/kernel/gpu/rc/kernel_rc.c": "NVIDIA/open-gpu-kernel-modules",
    "src/nvidia/src/kernel/gpu/gpu.c": "NVIDIA/open-gpu-kernel-modules",
    "src/nvc_container.c": "NVIDIA/libnvidia-container",
    "src/nvc_info.c": "NVIDIA/libnvidia-container",
    "src/nvc_mount.c": "NVIDIA/libnvidia-container",
    "docs/runtime.md": "k0sproject/k0s",
    "docs/usage/features.md": "kubevirt/user-guide",
    "deployments/helm/.../kubeletplugin.yaml": "NVIDIA/k8s-dra-driver-gpu",
    "deployments/gpu-operator/templates/clusterrole.yaml": "NVIDIA/gpu-operator",
    "examples/cluster-autoscaler": "NVIDIA/gpu-operator",
}


def named_paths() -> list[tuple[str, str]]:
    """(where, path) for every repository or module path the docs name; placeholders (<state>,
    {name}, POLICY) are left out."""
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            where = f"{doc.relative_to(ROOT)}:{number}"
            for path in REPO_PATH.findall(line):
                if not re.search(r"[<{]|/[A-Z]+$", path):
                    found.append((where, path.rstrip(".")))
            found.extend((where, f"src/gpu_operator/{path}") for path in MODULE_PATH.findall(line))
    return found


def test_every_path_the_docs_name_exists() -> None:
    paths = named_paths()
    assert len(paths) > 100, "the scan finds too few paths: it no longer reads the docs"
    missing = [
        f"{where}: {path}"
        for where, path in paths
        if path not in UPSTREAM and not glob.glob(str(ROOT / path))
    ]
    assert missing == [], (
        "the docs name paths this repository does not have (a source elsewhere: add it to UPSTREAM)"
    )


def test_the_upstream_list_holds_only_paths_the_docs_still_name() -> None:
    named = {path for _, path in named_paths()}
    assert sorted(set(UPSTREAM) - named) == []


# -- units ------------------------------------------------------------------------------------------


class NoKube:
    """The Manager's constructor reads only these; nothing here reaches an apiserver."""

    http: Any = None
    streams: Any = None
    statuses_written: dict[Any, Any] = {}


def built_units() -> list[str]:
    """The `loop` label of each unit the Manager builds, in its order."""
    manager = Manager(cast(Kube, NoKube()), Environment("gpu-operator"))
    return [loop.name for loop in manager.loops]


def test_the_passes_metric_lists_every_unit_the_manager_builds() -> None:
    row = next(r for r in tables(OPERATOR_MD, "metric") if "gpu_operator_controller_passes_total" in r[0])
    listed = re.search(r"\(([^)]*)\)", row[2])
    assert listed, "the passes_total row no longer lists its loop label values in parentheses"
    assert sorted(re.findall(r"`([^`]+)`", listed.group(1))) == sorted(built_units())


def test_the_docs_lists_of_units_are_the_folders() -> None:
    """README.md's `units/` line, the `loop` values above and docs/architecture.md's table of units
    are generated from the folders (tools/unitdocs.py)."""
    from tools import unitdocs

    folders = sorted(
        p.name for p in (SRC / "controllers" / "units").iterdir() if (p / "__init__.py").is_file()
    )
    assert [folder for folder, _, _ in unitdocs.units()] == folders
    assert unitdocs.stale() == [], f"the docs' lists of units are stale: run `{unitdocs.COMMAND}`"
    line = next(x for x in (ROOT / "README.md").read_text().splitlines() if x.strip().startswith("units/"))
    listed = re.search(r"\(([^)]*)\)", line)
    assert listed and listed.group(1).split(", ") == folders, line


def test_the_diagram_names_only_unit_folders_there_are() -> None:
    named = set(re.findall(r"\(units/(\w+)/", ARCHITECTURE_MD.read_text()))
    folders = {p.name for p in (SRC / "controllers" / "units").iterdir() if (p / "__init__.py").is_file()}
    assert named and sorted(named - folders) == []


# -- settings ---------------------------------------------------------------------------------------


def seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+) (s|min)", text.strip()).groups()  # type: ignore[union-attr]
    return float(number) * (60 if unit == "min" else 1)


def documented_default(text: str) -> Any:
    """The Settings table's Default cell as a value: `0.1 s`, `32`, `on`, `1 s doubling to 60 s`,
    `0.5, 1, 1, 2, 2, 2 s`."""
    if text in ("on", "off"):
        return text == "on"
    if " doubling to " in text:
        first, cap = text.split(" doubling to ")
        return Backoff(initial=seconds(first if " " in first else f"{first} s"), cap=seconds(cap))
    if "," in text:
        return tuple(float(x) for x in text.removesuffix(" s").split(","))
    if text.endswith((" s", " min")):
        return seconds(text)
    return int(text)


def test_the_settings_table_gives_the_code_defaults() -> None:
    rows = {row[0].strip("`"): row[1] for row in tables(OPERATOR_MD, "field")}
    defaults = OperatorSettings()
    assert sorted(rows) == sorted(f.name for f in dataclasses.fields(OperatorSettings))
    wrong = [
        f"{f.name}: docs {rows[f.name]!r}, code {getattr(defaults, f.name)!r}"
        for f in dataclasses.fields(OperatorSettings)
        if f.name in rows and documented_default(rows[f.name]) != getattr(defaults, f.name)
    ]
    assert wrong == []


# -- golden files -----------------------------------------------------------------------------------


def test_the_golden_figures_are_the_trees() -> None:
    text = " ".join(ARCHITECTURE_MD.read_text().split())
    found = re.search(
        r"\((\d+) example policies x (\d+) shapes: (\d+) cases x (\d+) states, (\d+) files for "
        r"([\d,]+) renders;",
        text,
    )
    assert found, "docs/architecture.md no longer gives the golden-file figures in the form this test reads"
    policies, shape_count, cases, states, files, renders = (int(g.replace(",", "")) for g in found.groups())
    golden = ROOT / "tests" / "unit" / "render" / "golden"
    table = yaml.safe_load((golden / "cases.yaml").read_text())
    assert policies == len(list((ROOT / "examples").glob("clusterpolicy-*.yaml")))
    assert shape_count == len(shapes.names())
    assert cases == len(table) == policies * shape_count
    assert states == len({state for case in table.values() for state in case})
    assert files == len([p for p in golden.rglob("*.yaml") if p.name != "cases.yaml"])
    assert renders == cases * states == sum(len(case) for case in table.values())
