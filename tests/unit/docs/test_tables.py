"""The docs' tables list what the code has, no more and no less: CLI commands (README.md and
docs/node-agents.md), doctor finding codes (docs/node-agents.md), the operator's metric names
(docs/operator.md), the node-status exporter's (docs/node-agents.md), and the source files the
docs' tables name. A new command, code or metric fails here until its row is written; a renamed
one fails until the row is fixed."""

from __future__ import annotations

import importlib
import pkgutil
import re
import tomllib
from pathlib import Path

import typer
from prometheus_client import REGISTRY

import gpu_operator.controllers
import gpu_operator.kube
from gpu_operator.cli import app
from gpu_operator.node.exporter import NodeStatusCollector
from gpu_operator.node.host.hostfs import HostFS

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "gpu_operator"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SPAN = re.compile(r"`([^`]+)`")


def tables(path: Path, first_header: str) -> list[list[str]]:
    """Rows (as cell lists) of every Markdown table in `path` whose first header cell is `first_header`."""
    rows: list[list[str]] = []
    inside = False
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if not inside:
            inside = cells[0].lower() == first_header.lower()
            continue
        if not set(cells[0]) <= set("-: "):
            rows.append(cells)
    assert rows or not first_header, f"{path.name}: no table headed '{first_header}'"
    return rows


def first_column_spans(path: Path, first_header: str) -> list[str]:
    return [span for row in tables(path, first_header) for span in SPAN.findall(row[0])]


# -- commands -------------------------------------------------------------------------------------


def code_commands() -> set[str]:
    """Every `gpu-operator` command path, e.g. "crds apply", "run"."""

    def walk(cmd: object, path: tuple[str, ...]) -> list[str]:
        subs = getattr(cmd, "commands", None)
        if not subs:
            return [" ".join(path)]
        return [leaf for name, sub in subs.items() if not sub.hidden for leaf in walk(sub, (*path, name))]

    return set(walk(typer.main.get_command(app), ()))


def scripts() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def command_words(text: str) -> list[str]:
    """The leading command words of `text`: up to an option, a placeholder (FILE, NODE) or a value."""
    words = []
    for word in text.split():
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        words.append(word)
    return words


def documented_commands(span: str) -> set[str]:
    """`gpu-operator crds generate\\|apply\\|print` -> {"crds generate", "crds apply", "crds print"};
    `gpu-operator upgrade status\\|retry NODE\\|pause` -> {"upgrade status", "upgrade retry", ...}."""
    first, *others = span.removeprefix("gpu-operator ").split("\\|")
    path = command_words(first)
    if not others:
        return {" ".join(path)}
    alternatives = [path[-1], *(command_words(other)[0] for other in others)]
    return {" ".join([*path[:-1], word]) for word in alternatives}


def test_every_command_is_in_a_commands_table_and_every_row_exists() -> None:
    spans = first_column_spans(ROOT / "README.md", "command") + first_column_spans(
        ROOT / "docs" / "node-agents.md", "command"
    )
    documented: set[str] = set()
    for span in spans:
        documented |= {span} if span in scripts() else documented_commands(span)
    commands = code_commands()
    groups = {" ".join(c.split()[:i]) for c in commands for i in range(1, len(c.split()))}
    assert sorted(documented - commands - groups - scripts()) == [], "documented but not a command"
    assert sorted(commands - documented) == [], "commands without a row in README.md or docs/node-agents.md"
    assert sorted(scripts() - documented - {"gpu-operator"}) == [], (
        "console scripts without a row in README.md"
    )


def test_command_expansion() -> None:
    assert documented_commands("gpu-operator crds generate\\|apply\\|print") == {
        "crds generate",
        "crds apply",
        "crds print",
    }
    assert documented_commands("gpu-operator render --policy FILE --shape dgx-h100:2") == {"render"}
    assert documented_commands("gpu-operator upgrade status\\|retry NODE\\|pause") == {
        "upgrade status",
        "upgrade retry",
        "upgrade pause",
    }


# -- doctor codes ---------------------------------------------------------------------------------


def test_doctor_codes_table_matches_the_findings() -> None:
    from gpu_operator.node.doctor.kernellog import NVRM_LINES

    names = ("findings.py", "vmchecks.py", "guestchecks.py", "troubleshoot.py", "kernellog.py")
    source = "".join((SRC / "node" / "doctor" / name).read_text() for name in names)
    codes = set(re.findall(r'\b_?finding\(\s*"([a-z][a-z0-9-]*)"', source))
    codes |= {line[1] for line in NVRM_LINES} | {"xid-N"}  # one code per Xid number: xid-79, ...
    assert len(codes) > 10, (
        "the pattern no longer finds the codes in node/doctor/findings.py and node/doctor/vmchecks.py"
    )
    documented = set(first_column_spans(ROOT / "docs" / "node-agents.md", "code"))
    assert sorted(codes - documented) == [], "finding codes missing from docs/node-agents.md"
    assert sorted(documented - codes) == [], "docs/node-agents.md lists codes the doctor does not have"


# -- metrics --------------------------------------------------------------------------------------


def operator_metrics() -> set[str]:
    """The operator's metric names as scraped (counters with their _total suffix); every module of
    the operator's packages is imported first, so every metric it defines is registered."""
    for package in (gpu_operator.controllers, gpu_operator.kube):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):  # unit folders too
            importlib.import_module(module.name)
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("gpu_operator_"):  # the node-status exporter has its own registry
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_operator_metrics_table_matches_the_registry() -> None:
    documented = set(first_column_spans(ROOT / "docs" / "operator.md", "metric"))
    documented = {re.sub(r"\{.*\}$", "", name) for name in documented}
    metrics = operator_metrics()
    assert "gpu_operator_reconciliation_total" in metrics
    assert sorted(metrics - documented) == [], "metrics missing from docs/operator.md"
    assert sorted(documented - metrics) == [], "docs/operator.md lists metrics the operator does not export"


def test_node_status_exporter_table_matches_the_collector(tmp_path: Path) -> None:
    # every optional check wired, so every gauge the exporter can serve is collected
    collector = NodeStatusCollector(
        HostFS(str(tmp_path)), driver_check=lambda: True, plugin_devices=lambda: 1
    )
    metrics = {family.name for family in collector.collect()}
    documented = set(first_column_spans(ROOT / "docs" / "node-agents.md", "metric"))
    assert len(metrics) == 10
    assert sorted(metrics - documented) == [], "exporter metrics missing from docs/node-agents.md"
    assert sorted(documented - metrics) == [], "docs/node-agents.md lists metrics the exporter does not serve"


# -- source files named in tables ------------------------------------------------------------------


def test_source_files_named_in_tables_exist() -> None:
    missing = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            if not line.startswith("| `"):
                continue
            for span in SPAN.findall(line.split("|")[1]):
                if re.fullmatch(r"[a-z_/]+\.py", span) and not any(
                    (base / span).exists() for base in (SRC, ROOT)
                ):
                    missing.append(f"{doc.name}: {span}")
    assert missing == []
