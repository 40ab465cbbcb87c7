"""`gpu-operator cleanup` (admin/cleanup.py, running the units' takeback.py): only the nodes a
driver upgrade cordoned are uncordoned, and its help names every kind it deletes."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.controllers.cleanup import OWNER_KINDS
from gpu_operator.controllers.units.upgrade.takeback import cordoned_by_us


def _upgrading(state: str, unschedulable: bool, initially: str | None = None) -> dict[str, Any]:
    annotations = (
        {}
        if initially is None
        else {"nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable": initially}
    )
    return {
        "metadata": {
            "name": "n",
            "labels": {"nvidia.com/gpu-driver-upgrade-state": state} if state else {},
            "annotations": annotations,
        },
        "spec": {"unschedulable": unschedulable},
    }


@pytest.mark.parametrize(
    ("node", "ours"),
    [
        (_upgrading("wait-for-jobs-required", True), True),
        (_upgrading("drain-required", True, "false"), True),  # `upgrade retry` of a node we cordoned
        (_upgrading("upgrade-failed", True), True),
        (_upgrading("validation-required", True, "true"), False),  # cordoned before the upgrade began
        (_upgrading("upgrade-required", True), False),  # not cordoned by us yet: a user's cordon
        (_upgrading("cordon-required", True), False),
        (_upgrading("upgrade-done", True), False),
        (_upgrading("", True), False),
        (_upgrading("wait-for-jobs-required", False), False),
    ],
)
def test_only_nodes_the_upgrade_cordoned_are_uncordoned(node: dict[str, Any], ours: bool) -> None:
    assert cordoned_by_us(node) is ours


def test_cleanup_help_names_every_kind_it_deletes() -> None:
    text = " ".join(CliRunner().invoke(app, ["cleanup", "--help"]).output.replace("│", "").split())
    assert [kind for _, kind in OWNER_KINDS if kind not in text] == [], text


def test_cleanup_takes_back_what_gpu_health_wrote_on_every_node() -> None:
    """A node in remediation (condition, quarantine taint, cordoned by remediation) and one cordoned
    by its admin before remediation began: cleanup removes the condition and our taint from both,
    uncordons only the first (remediation's own record says whose cordon it is: read before
    strip_nodes takes our annotations, which the real apiserver's managedFields decide and
    tests/integration/test_clean_uninstall.py covers)."""
    import asyncio

    from gpu_operator.admin.cleanup import cleanup
    from gpu_operator.controllers.units.health import machine as hm
    from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_REPORT_ANNOTATION, HEALTH_STATE, HEALTH_TAINT
    from tests.unit.controllers.healthkit import FakeKube
    from tests.unit.controllers.units.health.test_health_unit import (
        OTHER_TAINT,
        XID48,
        make,
        policy,
        run_pass,
    )

    class Cluster(FakeKube):
        async def list_dicts(
            self,
            api_version: str,
            kind: str,
            namespace: str | None = None,
            labels: dict[str, str] | None = None,
        ) -> list[dict[str, Any]]:
            return (
                [] if (api_version, kind) != ("v1", "Node") else await super().list_dicts(api_version, kind)
            )

        async def served_versions(self, group: str, kind: str) -> list[str]:
            return []  # no DeviceTaintRule here (the DRA stack's rules: tests/unit/controllers/units/health/test_health_dra.py)

    kube = Cluster()
    for name in ("ours", "theirs"):
        kube.add_node(name, {HEALTH_REPORT_ANNOTATION: XID48})
    kube.nodes["theirs"]["spec"]["unschedulable"] = True  # cordoned by its admin
    unit = make(kube, policy({"remediation": {"enabled": True, "maxUnavailable": 2}}))
    for _ in range(3):  # quarantined, then draining (cordoned) and on
        run_pass(unit, kube)
    for name in ("ours", "theirs"):
        node = kube.nodes[name]
        node["spec"]["taints"].append(OTHER_TAINT)
        assert node["metadata"]["labels"][HEALTH_STATE] in hm.ACTIVE and node["spec"]["unschedulable"] is True
    done = asyncio.run(cleanup(kube))  # type: ignore[arg-type]
    for name in ("ours", "theirs"):
        node = kube.nodes[name]
        assert [c["type"] for c in node["status"].get("conditions") or []].count(HEALTH_CONDITION) == 0
        assert [t["key"] for t in node["spec"]["taints"]] == [OTHER_TAINT["key"]]
    assert (
        kube.nodes["ours"]["spec"]["unschedulable"] is False and kube.nodes["theirs"]["spec"]["unschedulable"]
    )
    assert (
        f"node ours: removed taint {HEALTH_TAINT}" in done
        and "node ours: uncordoned (cordoned by GPU remediation)" in done
    )


def test_cleanup_keeps_a_crd_another_helm_release_owns() -> None:
    """NVIDIA's DRA driver chart owns the ComputeDomain CRD here: `cleanup --crds` leaves it to that
    release and deletes ours (all empty)."""
    import asyncio
    import copy
    from typing import cast

    from gpu_operator.admin.cleanup import delete_crds
    from gpu_operator.api.crdgen import load_packaged
    from gpu_operator.kube.client import Kube, ObjectKey

    crds = {c["metadata"]["name"]: copy.deepcopy(c) for c in load_packaged()}
    crds["computedomains.resource.nvidia.com"]["metadata"].update(
        labels={"app.kubernetes.io/managed-by": "Helm"},
        annotations={"meta.helm.sh/release-name": "dra", "meta.helm.sh/release-namespace": "nvidia-dra"},
    )

    class CRDs:
        def __init__(self) -> None:
            self.deleted: list[str] = []

        async def get_dict(
            self,
            api_version: str,
            kind: str,
            name: str,
            namespace: str | None = None,
        ) -> dict[str, Any] | None:
            return crds.get(name)

        async def count_items(self, *_: Any) -> int:
            return 0

        async def delete(self, key: ObjectKey, **_: Any) -> bool:
            self.deleted.append(key.name)
            return True

    kube = CRDs()
    deleted = asyncio.run(delete_crds(cast(Kube, kube)))
    assert (
        sorted(deleted) == sorted(kube.deleted) == sorted(set(crds) - {"computedomains.resource.nvidia.com"})
    )
