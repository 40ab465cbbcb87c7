"""docs/security.md's table of every ServiceAccount we create and what it may do, held true by the
real apiserver: the chart's RBAC (node discovery and the hooks included) and every Role and
ClusterRole the operator renders (every policy of test_chart_permissions, a GPUCluster, and an
NVIDIADriver of each driverType, whose ServiceAccounts carry the CR's name) are applied, and each identity asks, with its own token, what it may do (SelfSubjectRulesReview) in the
operator's namespace and in another one. A permission the table does not list fails the test, and
so does a listed one the identity no longer has.

When a change is meant, rewrite the table with UPDATE_PERMISSION_TABLE=1 and review the diff (the
run that rewrites fails, so it is never a silent pass)."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.models.authorization_v1 import SelfSubjectRulesReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectRulesReview
from lightkube.resources.core_v1 import Namespace

from gpu_operator.sim.plane.controlplane import ControlPlane
from tests.support.chart import find, objects, render_chart
from tests.support.cleanup import delete_if_present
from tests.unit.chart.test_chart_owned_names import GPUCLUSTER, rendered
from tests.unit.chart.test_chart_permissions import POLICIES

NAMESPACE = "gpu-operator-perms"
OTHER = "default"
DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN, END = "<!-- permission table: begin -->", "<!-- permission table: end -->"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
UPDATE = os.environ.get("UPDATE_PERMISSION_TABLE", "") not in ("", "0")
# An NVIDIADriver's ServiceAccount and RBAC carry its name (render/nvidiadriver.py shared_name): the
# table writes NVIDIADRIVER for it
DRIVER_CR = "perm-table-driver"
DRIVER_TYPES = ("gpu", "vgpu", "vgpu-host-manager")
# (account, scope, group, resource, verb, name); scope "cluster" or "namespace" (the operator's)
Row = tuple[str, str, str, str, str, str]


def rendered_rbac() -> list[dict[str, Any]]:
    """The chart's RBAC objects (hooks and node discovery too) and every operand's the operator renders."""
    out = [
        o
        for o in objects(render_chart({"nfd": {"enabled": True}}, namespace=NAMESPACE))
        if o["kind"] in RBAC_KINDS
    ]
    docs: list[tuple[str, dict[str, Any]]] = [
        ("--policy", find(render_chart(spec, namespace=NAMESPACE), "ClusterPolicy", "cluster-policy"))
        for spec in POLICIES.values()
    ]
    docs.append(("--gpucluster", GPUCLUSTER))
    with tempfile.TemporaryDirectory() as tmp:
        for flag, doc in docs:
            shape = ["--shape", "dgx-h100:1"] if flag == "--policy" else []
            out += [o for o in rendered([*shape, flag], Path(tmp), doc, NAMESPACE) if o["kind"] in RBAC_KINDS]
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(
            yaml.safe_dump(find(render_chart({}, namespace=NAMESPACE), "ClusterPolicy", "cluster-policy"))
        )
        for driver_type in DRIVER_TYPES:
            driver = {
                "apiVersion": "nvidia.com/v1alpha1",
                "kind": "NVIDIADriver",
                "metadata": {"name": DRIVER_CR},
                "spec": {"driverType": driver_type, "version": "580.82.07"},
            }
            argv = ["--shape", "dgx-h100:1", "--policy", str(policy), "--nvidiadriver"]
            out += [o for o in rendered(argv, Path(tmp), driver, NAMESPACE) if o["kind"] in RBAC_KINDS]
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in out:
        unique[(obj["kind"], obj["metadata"]["name"])] = obj
    return list(unique.values())


def expand(rules: list[Any]) -> set[tuple[str, str, str, str]]:
    found = set()
    for rule in rules:
        for group in rule.apiGroups or [""]:
            for resource in rule.resources or []:
                for verb in rule.verbs:
                    for name in rule.resourceNames or [""]:
                        found.add((group, resource, verb, name))
    return found


def rules_in(client: Client, namespace: str) -> set[tuple[str, str, str, str]]:
    review = client.create(SelfSubjectRulesReview(spec=SelfSubjectRulesReviewSpec(namespace=namespace)))
    assert review.status is not None and not review.status.incomplete, review.status
    return expand(review.status.resourceRules)


@pytest.fixture(scope="module")
def answered(control_plane: ControlPlane, kube: Client) -> Iterator[set[Row]]:
    objs = rendered_rbac()
    kube.apply(
        from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}), force=True
    )
    for obj in objs:
        kube.apply(from_dict(obj), force=True)
    accounts = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount")
    # what any ServiceAccount may do (discovery, self reviews): no one's particular grant
    baseline_account = "perm-table-nobody"
    clients: dict[str, Client] = {}
    try:
        for account in [*accounts, baseline_account]:
            config = control_plane.serviceaccount_kubeconfig(
                NAMESPACE, account, create=account == baseline_account
            )
            clients[account] = Client(KubeConfig.from_file(config))
        base = rules_in(clients[baseline_account], NAMESPACE)
        rows: set[Row] = set()
        for account in accounts:
            cluster = rules_in(clients[account], OTHER) - base
            here = rules_in(clients[account], NAMESPACE) - base - cluster
            rows |= {(account, "cluster", *p) for p in cluster} | {(account, "namespace", *p) for p in here}
        yield {
            tuple(c.replace(NAMESPACE, "RELEASE_NAMESPACE").replace(DRIVER_CR, "NVIDIADRIVER") for c in row)  # type: ignore[misc]
            for row in rows
        }
    finally:
        for client in clients.values():
            client.close()
        for obj in objs:
            if "namespace" not in obj["metadata"]:
                delete_if_present(kube, type(from_dict(obj)), obj["metadata"]["name"])
        kube.delete(Namespace, NAMESPACE)


def table(rows: set[Row]) -> str:
    """One line per account, scope, group, verbs and names: the resources they apply to."""
    grouped: dict[tuple[str, str, str, str, str], set[str]] = {}
    by_resource: dict[tuple[str, str, str, str, str], set[str]] = {}
    for account, scope, group, resource, verb, name in rows:
        by_resource.setdefault((account, scope, group, resource, name), set()).add(verb)
    for (account, scope, group, resource, name), verb_set in by_resource.items():
        grouped.setdefault((account, scope, group, ", ".join(sorted(verb_set)), name), set()).add(resource)
    lines = [
        "| ServiceAccount | Scope | API group | Resources | Verbs | Names |",
        "|---|---|---|---|---|---|",
    ]
    for (account, scope, group, verbs, name), resources in sorted(grouped.items()):
        lines.append(
            f"| {account} | {scope} | {group or 'core'} | {', '.join(sorted(resources))} | {verbs} | {name} |"
        )
    return "\n".join(lines)


def parse(text: str) -> set[Row]:
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    rows: set[Row] = set()
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] in ("ServiceAccount", "") or set(cells[0]) <= {"-"}:
            continue
        account, scope, group, resources, verbs, name = cells
        for resource in re.split(r",\s*", resources):
            for verb in re.split(r",\s*", verbs):
                rows.add((account, scope, "" if group == "core" else group, resource, verb, name))
    return rows


def test_the_table_lists_exactly_what_each_serviceaccount_may_do(answered: set[Row]) -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} has no permission table markers"
    if UPDATE:
        before, rest = text.split(BEGIN, 1)
        DOC.write_text(f"{before}{BEGIN}\n{table(answered)}\n{END}{rest.split(END, 1)[1]}")
        pytest.fail(
            "UPDATE_PERMISSION_TABLE is set: the table was rewritten; review the diff, run again without it"
        )
    listed = parse(text)
    unlisted = sorted(answered - listed)
    gone = sorted(listed - answered)
    assert unlisted == [], "granted but not in docs/security.md's table:\n" + "\n".join(map(str, unlisted))
    assert gone == [], "in docs/security.md's table but no longer granted:\n" + "\n".join(map(str, gone))


def test_the_table_parser_reads_what_the_writer_writes() -> None:
    rows: set[Row] = {
        ("a", "cluster", "", "nodes", "get", ""),
        ("a", "cluster", "", "nodes", "patch", ""),
        ("a", "cluster", "", "pods", "get", ""),
        ("b", "namespace", "apps", "daemonsets", "list", "x"),
    }
    assert parse(f"{BEGIN}\n{table(rows)}\n{END}") == rows
