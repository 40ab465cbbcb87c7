"""Turns a StatusView into rich renderables: the nodes x components table, policy line, problems."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpu_operator.statusview.health import NodeHealth
from gpu_operator.statusview.mig import TROUBLE, NodeMIG
from gpu_operator.statusview.table import Cell, StatusView
from gpu_operator.statusview.upgrades import NodeUpgrade
from gpu_operator.vocabulary import UPGRADE_DONE, UPGRADE_FAILED, UPGRADE_REQUIRED

# Short column headers: the full component names would make a 12-column table unreadable.
SHORT = {
    "driver": "driver",
    "gpu-feature-discovery": "gfd",
    "container-toolkit": "toolkit",
    "device-plugin": "plugin",
    "dcgm": "dcgm",
    "dcgm-exporter": "dcgm-exp",
    "mig-manager": "mig-mgr",
    "node-status-exporter": "status-exp",
    "operator-validator": "validator",
    "sandbox-device-plugin": "sbx-plugin",
    "sandbox-validator": "sbx-valid",
    "vfio-manager": "vfio",
    "kata-manager": "kata",
    "cc-manager": "cc",
    "vgpu-manager": "vgpu-mgr",
    "vgpu-device-manager": "vgpu-dev",
}


def cell_text(cell: Cell) -> Text:
    if cell.ready is None:
        if cell.label is None:
            return Text("·", style="dim")
        return Text(cell.label if cell.label != "true" else "on", style="dim")
    if cell.ready:
        return Text("✓", style="green")
    failed = any(s in cell.pod for s in ("Failed", "Unknown"))
    return Text(f"✗ {cell.pod}" if failed else f"… {cell.pod}", style="red" if failed else "yellow")


def shown_components(view: StatusView) -> tuple[list[str], list[str]]:
    """(columns with an operand somewhere, components whose deploy label no operand uses): the
    latter (disabled operands, labels for other stacks) go in a footnote to keep the table narrow."""
    used = {c for row in view.rows for c, cell in row.cells.items() if cell.expected}
    return [c for c in view.components if c in used], [c for c in view.components if c not in used]


def policy_text(view: StatusView) -> Text:
    policy = view.policy
    if policy is None:
        return Text("ClusterPolicy/GPUCluster: none", style="red")
    style = {"ready": "green", "notReady": "yellow", "ignored": "dim"}.get(policy.state, "yellow")
    text = Text(f"{policy.kind} ")
    text.append(policy.name, style="bold")
    text.append(": ")
    text.append(policy.state or "not reconciled yet", style=f"bold {style}")
    if policy.reason:
        text.append(f" ({policy.reason})")
    if view.namespace:
        text.append(f"   operands in namespace {view.namespace}", style="dim")
    if view.platform:
        text.append(f"   platform {view.platform}", style="dim")
    return text


def node_table(view: StatusView, max_nodes: int = 40) -> Table:
    ready, expected = view.counts()
    title = f"GPU nodes: {len(view.rows)}   operand pods ready: {ready}/{expected}"
    if view.other_nodes:
        title += f"   (+{view.other_nodes} node(s) without GPU)"
    table = Table(title=title, title_justify="left", header_style="bold", pad_edge=False)
    table.add_column("node", no_wrap=True)
    stacks = any(r.stack == "dra" for r in view.rows) or (
        view.policy is not None and view.policy.kind == "GPUCluster"
    )
    if stacks:
        table.add_column("stack", no_wrap=True)
    columns, _ = shown_components(view)
    for component in columns:
        table.add_column(SHORT.get(component, component), no_wrap=True)
    table.add_column("validation", no_wrap=True)
    upgrades = any(r.upgrade is not None and r.upgrade.state for r in view.rows)
    if upgrades:
        table.add_column("driver upgrade", no_wrap=True)
    healths = any(r.health is not None and r.health.text for r in view.rows)
    if healths:
        table.add_column("health", no_wrap=True)
    migs = any(r.mig is not None and r.mig.text for r in view.rows)
    if migs:
        table.add_column("mig", no_wrap=True)
    # Not-ready nodes first: on a big cluster those are the rows worth the screen.
    rows = sorted(view.rows, key=lambda r: (r.ready, r.name))
    for row in rows[:max_nodes]:
        validation = Text(
            row.validation or "·",
            style="green"
            if row.validation.startswith("passed")
            else "dim"
            if not row.validation
            else "yellow",
        )
        extra = [upgrade_text(row.upgrade)] if upgrades else []
        extra += [health_text(row.health)] if healths else []
        extra += [mig_text(row.mig)] if migs else []
        stack = [Text(row.stack or "·", style="dim" if not row.stack else "")] if stacks else []
        table.add_row(Text(row.name), *stack, *(cell_text(row.cells[c]) for c in columns), validation, *extra)
    if len(rows) > max_nodes:
        rest = rows[max_nodes:]
        not_ready = sum(1 for r in rest if not r.ready)
        table.add_row(Text(f"… {len(rest)} more ({not_ready} not ready)", style="dim"))
    return table


def health_text(health: NodeHealth | None) -> Text:
    if health is None or not health.text:
        return Text("·", style="dim")
    style = "green" if health.ready == "True" else "red" if health.tainted or health.remediation else "yellow"
    return Text(health.text, style=style)


def mig_text(mig: NodeMIG | None) -> Text:
    if mig is None or not mig.text:
        return Text("·", style="dim")
    style = (
        "green"
        if mig.state == "success" and mig.reason not in TROUBLE
        else ("red" if mig.reason in TROUBLE else "yellow")
    )
    return Text(mig.text, style=style)


def upgrade_text(upgrade: NodeUpgrade | None) -> Text:
    if upgrade is None or not upgrade.state:
        return Text("·", style="dim")
    style = {UPGRADE_DONE: "green", UPGRADE_FAILED: "red", UPGRADE_REQUIRED: "dim"}.get(
        upgrade.state, "yellow"
    )
    return Text(upgrade.text, style=style)


LEGEND = (
    "cells: the component's DaemonSet pod on the node where its deploy label "
    "(nvidia.com/gpu.deploy.<component>) is true: ✓ Running and Ready, … its phase while not "
    "ready, ✗ failed; otherwise the label's value (on = set, but no operand selects the node; "
    "· = no label)"
)


def render_view(view: StatusView, max_nodes: int = 40, legend: bool = True) -> RenderableType:
    parts: list[RenderableType] = [policy_text(view), node_table(view, max_nodes)]
    if view.problems:
        parts.append(Text("Not ready:", style="bold yellow"))
        parts.extend(Text(f"  - {p}") for p in view.problems[:12])
        if len(view.problems) > 12:
            parts.append(Text(f"  … {len(view.problems) - 12} more", style="dim"))
    elif view.ready:
        parts.append(Text("Everything is ready.", style="bold green"))
    parts.extend(Text(crd.sentence(), style="dim") for crd in view.crds if crd.compatible)
    if legend:
        _, label_only = shown_components(view)
        if label_only:
            parts.append(
                Text(
                    f"deploy labels without an operand here (disabled or another stack): "
                    f"{', '.join(label_only)}",
                    style="dim",
                )
            )
        parts.append(Text(LEGEND, style="dim"))
    return Group(*parts)


def one_line(view: StatusView) -> str:
    """A progress line for logs and non-terminal output."""
    ready, expected = view.counts()
    state = view.policy.state or "pending" if view.policy else "none"
    kind = view.policy.kind if view.policy else "ClusterPolicy"
    return f"{kind} {state}; operand pods ready {ready}/{expected} on {len(view.rows)} GPU node(s)"


def make_console() -> Console:
    """A console for the view: piped output gets 120 columns instead of rich's 80, so that the
    table is not squeezed into ellipses in logs and CI."""
    console = Console()
    return console if console.is_terminal else Console(width=120)
