"""RBAC rules as sets of single permissions, so tests can compare what a role grants with what is needed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# (apiGroup, resource, verb, resourceName or None)
Permission = tuple[str, str, str, str | None]


def grant(
    group: str, resources: Iterable[str], verbs: Iterable[str], names: Iterable[str] = ()
) -> set[Permission]:
    """Every permission a rule with these groups, resources, verbs and resourceNames grants."""
    return {(group, r, v, n) for r in resources for v in verbs for n in (tuple(names) or (None,))}


def expand(rules: list[dict[str, Any]]) -> set[Permission]:
    """Every permission a Role's or ClusterRole's rules grant."""
    found: set[Permission] = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            found |= grant(group, rule["resources"], rule["verbs"], rule.get("resourceNames") or ())
    return found


def covers(held: set[Permission], wanted: Permission) -> bool:
    """Whether `held` allows `wanted` (a rule without resourceNames allows every name)."""
    group, resource, verb, name = wanted
    return (group, resource, verb, None) in held or (name is not None and wanted in held)
