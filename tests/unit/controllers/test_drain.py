"""The one drain (controllers/drain.py) that driver upgrades and GPU health remediation both use:
the pods' facts read once per node, the decision, the evictions; and the boundary that keeps it
one: no module of controllers/ reaches into another module's underscore-prefixed names."""

from __future__ import annotations

import ast
import asyncio
from typing import Any

from gpu_operator.controllers import drain
from gpu_operator.controllers.gpuholders import RuntimeAccess
from tests.support.imports import modules
from tests.unit.controllers.healthkit import FakeKube

C = "gpu_operator.controllers"


def pod(name: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
        },
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    }


def test_selectors_match_a_pod_by_namespace_and_name() -> None:
    kube: Any = FakeKube()
    # the same pod name in two namespaces: only the labelled one matches the selectors
    kube.pods = [pod("train", "a", {"drain": "yes", "job": "yes"}), pod("train", "b")]
    facts = asyncio.run(
        drain.pods_on(
            kube,
            "n1",
            {("b", "train"): "b/keep"},
            access=RuntimeAccess(),
            wait_selector="job=yes",
            drain_selector="drain=yes",
        )
    )
    by_ns = {f.namespace: f for f in facts}
    assert (by_ns["a"].drain_match, by_ns["a"].wait_match) == (True, True)
    assert (by_ns["b"].drain_match, by_ns["b"].wait_match) == (False, False)
    assert by_ns["b"].blocked_by == "b/keep" and by_ns["a"].gpu
    # no selector: every pod may be drained, none is waited for; one list only
    kube.calls.clear()
    plain = asyncio.run(drain.pods_on(kube, "n1", {}, access=RuntimeAccess()))
    assert [(f.drain_match, f.wait_match) for f in plain] == [(True, False), (True, False)]


def test_evict_remembers_a_budgets_refusal_and_forgets_it_once_accepted() -> None:
    kube: Any = FakeKube()
    kube.pods = [pod("w", "ml"), pod("x", "ml")]
    kube.pdb_blocks = {"w": "budget"}
    blocked: drain.EvictionRefusals = {("ml", "x"): "ml/old"}
    asyncio.run(drain.evict(kube, [drain.PodFacts("w", "ml"), drain.PodFacts("x", "ml")], blocked))
    assert [c for c in kube.calls if c[0] == "evict"] == [("evict", "ml/w"), ("evict", "ml/x")]
    assert blocked == {("ml", "w"): "ml/budget"}


def test_decide_first_pass_then_wait_then_the_timeout_names_the_budget() -> None:
    pods = [drain.PodFacts("w", "ml"), drain.PodFacts("t", "ml", terminating=True)]
    first = drain.decide(pods, None, 60, 1000.0, force=False, empty_dir=False, what="drain")
    assert (first.outcome, first.start, [p.name for p in first.evict]) == (drain.WAIT, "1000", ["w", "t"])
    later = drain.decide(pods, 1000.0, 60, 1060.0, force=False, empty_dir=False, what="drain")
    assert (later.outcome, later.start, [p.name for p in later.evict]) == (drain.WAIT, None, ["w"])
    blocked = [drain.PodFacts("w", "ml", blocked_by="ml/budget")]
    late = drain.decide(blocked, 1000.0, 60, 1061.0, force=False, empty_dir=False, what="drain")
    assert late.outcome == drain.FAILED and "PodDisruptionBudget ml/budget" in late.reason
    assert (
        drain.decide(blocked, 1000.0, 0, 99999.0, force=False, empty_dir=False, what="drain").outcome
        == drain.WAIT
    )
    bare = [drain.PodFacts("b", "ml", controlled=False)]
    assert (
        drain.decide(bare, None, 60, 0.0, force=False, empty_dir=False, what="drain").outcome == drain.FAILED
    )
    assert drain.decide(bare, None, 60, 0.0, force=True, empty_dir=False, what="drain").outcome == drain.WAIT
    assert drain.decide([], None, 60, 0.0, force=False, empty_dir=False, what="drain").outcome == drain.DONE
    assert (drain.started_at("12"), drain.started_at(None), drain.started_at("soon")) == (12.0, None, None)


def _private_uses(name: str, tree: ast.AST, known: set[str]) -> list[str]:
    """`from controllers.x import _y` and `alias._y` where alias names another controllers module."""
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:  # `from gpu_operator.controllers import drain as node_drain`
                    aliases[alias.asname or alias.name] = full
                elif node.module in known and node.module != name and _private(alias.name):
                    found.append(f"{name} imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != name
            and _private(node.attr)
        ):
            found.append(f"{name} uses {aliases[node.value.id]}.{node.attr}")
    return found


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def test_no_controllers_module_uses_another_modules_private_names() -> None:
    known = modules()
    crossing = []
    for name, path in sorted(known.items()):
        if name.startswith(f"{C}."):
            crossing += _private_uses(
                name, ast.parse(path.read_text()), {m for m in known if m.startswith(C)}
            )
    assert crossing == [], (
        "private names used across modules (make them public, or move the code):\n" + "\n".join(crossing)
    )


def test_the_boundary_check_sees_a_private_drain_call() -> None:
    known = {f"{C}.units.upgrade.state", f"{C}.drain"}
    posing = "from gpu_operator.controllers.units.upgrade import state as us\nus._eviction(1)\n"
    direct = "from gpu_operator.controllers.units.upgrade.state import _eviction\n"
    assert _private_uses(f"{C}.units.health.machine", ast.parse(posing), known) == [
        f"{C}.units.health.machine uses {C}.units.upgrade.state._eviction"
    ]
    assert _private_uses(f"{C}.units.health.machine", ast.parse(direct), known) == [
        f"{C}.units.health.machine imports {C}.units.upgrade.state._eviction"
    ]
    assert _private_uses(f"{C}.units.upgrade.state", ast.parse(posing), known) == []
