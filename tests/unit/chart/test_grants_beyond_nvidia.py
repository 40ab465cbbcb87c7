"""docs/security.md's "Grants beyond NVIDIA's" table against the operator's RBAC in the chart: every
permission our operator's ClusterRole or Role grants that NVIDIA's v26.7.0 chart does not (recorded in
data/nvidia-v26.7.0-operator-rbac.txt) has a row there, and every row names only such permissions.
Compared by API group, resource and verb; resourceNames (ours only: narrower) are left out. A Role
permission is NVIDIA's when NVIDIA's ClusterRole or Role grants it; a ClusterRole one only when its
ClusterRole does (its Role reaches only its namespace)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.chart import Rendered, find
from tests.support.permissions import expand

ROOT = Path(__file__).resolve().parents[3]
NVIDIA = Path(__file__).parent / "data" / "nvidia-v26.7.0-operator-rbac.txt"
DOC = ROOT / "docs" / "security.md"
HEADING = "## Grants beyond NVIDIA's"
# (kind, group, resource, verb); kind "ClusterRole" or "Role", group "" for core
Grant = tuple[str, str, str, str]


def nvidia() -> dict[str, set[tuple[str, str, str]]]:
    """scope ("cluster", "namespace") -> NVIDIA's (group, resource, verb)."""
    found: dict[str, set[tuple[str, str, str]]] = {"cluster": set(), "namespace": set()}
    for line in NVIDIA.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        scope, group, resource, verbs = line.split()
        found[scope] |= {("" if group == "core" else group, resource, verb) for verb in verbs.split(",")}
    return found


def beyond(roles: dict[str, list[dict[str, Any]]]) -> set[Grant]:
    """What these rules ({"ClusterRole": rules, "Role": rules}) grant that NVIDIA's do not."""
    held = nvidia()
    reach = {"ClusterRole": held["cluster"], "Role": held["cluster"] | held["namespace"]}
    out: set[Grant] = set()
    for kind, rules in roles.items():
        out |= {(kind, g, r, v) for g, r, v, _ in expand(rules) if (g, r, v) not in reach[kind]}
    return out


def operator_roles(rendered: Rendered) -> dict[str, list[dict[str, Any]]]:
    return {kind: find(rendered, kind, "gpu-operator")["rules"] for kind in ("ClusterRole", "Role")}


def table_rows(text: str) -> dict[str, set[Grant]]:
    """The section's table: row text -> what the row's first four cells name (cells may list several,
    comma-separated; `(OpenShift)` and backquotes are ignored)."""
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[Grant]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 6 or cells[0] in ("role", "") or set(cells[0]) <= {"-"}:
            continue

        def items(cell: str) -> list[str]:
            return [re.sub(r"\(.*?\)|`", "", i).strip() for i in cell.split(",") if i.strip()]

        kinds, groups, resources, verbs = (items(c) for c in cells[:4])
        rows[line] = {
            (k, "" if g == "core" else g, r, v)
            for k in kinds
            for g in groups
            for r in resources
            for v in verbs
        }
    return rows


def test_every_grant_beyond_nvidias_has_a_row_and_every_row_is_one(render: Callable[..., Rendered]) -> None:
    ours = beyond(operator_roles(render())) | beyond(
        operator_roles(render({"platform": {"openshift": True}}))
    )
    rows = table_rows(DOC.read_text())
    assert rows, f"no table under {HEADING!r} in {DOC}"
    listed = set().union(*rows.values())
    missing = sorted(ours - listed)
    assert missing == [], (
        f"beyond NVIDIA's v26.7.0 but not in {DOC.name}'s table (a row and its reason):\n"
        + "\n".join(map(str, missing))
    )
    stale = {line: sorted(grants - ours) for line, grants in rows.items() if grants - ours}
    assert stale == {}, "rows naming grants we do not hold or NVIDIA's v26.7.0 holds too:\n" + "\n".join(
        f"{line}\n  {extra}" for line, extra in stale.items()
    )


def test_the_check_catches_an_unlisted_grant(render: Callable[..., Rendered]) -> None:
    roles = operator_roles(render())
    roles["Role"].append({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]})
    assert ("Role", "example.com", "widgets", "get") in beyond(roles)
    # what NVIDIA's Role grants is not beyond in our Role; in our ClusterRole (every namespace) it is
    assert ("Role", "", "services", "delete") not in beyond(roles)
    roles["ClusterRole"].append({"apiGroups": [""], "resources": ["services"], "verbs": ["delete"]})
    assert ("ClusterRole", "", "services", "delete") in beyond(roles)
    # a row that names a grant NVIDIA holds too is stale
    line = "| ClusterRole | core | `nodes` | get | the same | - |"
    assert table_rows(f"{HEADING}\n\n{line}\n") == {line: {("ClusterRole", "", "nodes", "get")}}
