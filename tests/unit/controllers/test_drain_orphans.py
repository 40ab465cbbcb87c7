"""An operand pod orphaned for a moment (its DaemonSet deleted leaving its pods, to change the
selector: controllers/apply.py; the take-over of NVIDIA's GFD and validator does it) is a
DaemonSet's pod, not a workload: a driver upgrade's GPU pod deletion once refused such a pod as
uncontrolled and failed the node (tests/integration/test_takeover_nvidiadriver.py's setting with
auto-upgrade on)."""

from __future__ import annotations

from typing import Any

from gpu_operator.controllers import drain
from gpu_operator.controllers.gpuholders import RuntimeAccess
from gpu_operator.controllers.units.upgrade import state as us
from tests.unit.controllers.units.upgrade.test_upgrade_state import NOW, OLD, ON, node

DS_LABELS = {"controller-revision-hash": "6c8f9d7b5", "pod-template-generation": "1"}


def pod(labels: dict[str, str], owner_kind: str | None = None) -> dict[str, Any]:
    refs = [{"kind": owner_kind, "name": "x", "uid": "u", "controller": True}] if owner_kind else []
    return {
        "metadata": {
            "name": "gpu-feature-discovery-wqvfx",
            "namespace": "ns",
            "labels": labels,
            "ownerReferences": refs,
        },
        "spec": {"runtimeClassName": "nvidia", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def facts(obj: dict[str, Any], operands: str | None = "ns") -> drain.PodFacts:
    return drain.pod_facts(
        obj,
        set(),
        None,
        {},
        access=RuntimeAccess(classes=frozenset({"nvidia"})),
        claims={},
        operands=operands,
    )


def test_an_orphaned_daemonset_pod_is_a_daemonsets_pod() -> None:
    orphan = facts(pod(DS_LABELS))
    assert orphan.gpu and orphan.daemonset and not orphan.controlled
    assert facts(pod(DS_LABELS, "DaemonSet")).daemonset
    # A StatefulSet's pod (controller-revision-hash only) or a bare pod is no DaemonSet's.
    assert not facts(pod({"controller-revision-hash": "1"})).daemonset
    assert not facts(pod({})).daemonset
    assert not facts(pod(DS_LABELS, "ReplicaSet")).daemonset
    # Outside the operator's namespace the labels prove nothing: anyone who may create pods can
    # set them on a bare GPU pod, which then stays a workload (refused uncontrolled, not passed over).
    assert not facts(pod(DS_LABELS), operands="gpu-operator").daemonset
    assert not facts(pod(DS_LABELS), operands=None).daemonset


def test_gpu_pod_deletion_passes_over_an_orphaned_operand_pod() -> None:
    step = us.decide(node(us.POD_DELETION_REQUIRED, OLD, pods=(facts(pod(DS_LABELS)),)), ON, NOW, False)
    assert step.state == us.POD_RESTART_REQUIRED
    bare = us.decide(node(us.POD_DELETION_REQUIRED, OLD, pods=(facts(pod({})),)), ON, NOW, False)
    assert bare.state == us.UPGRADE_FAILED
    forged = facts(pod(DS_LABELS), operands="gpu-operator")  # a tenant's bare pod with the labels
    assert (
        us.decide(node(us.POD_DELETION_REQUIRED, OLD, pods=(forged,)), ON, NOW, False).state
        == us.UPGRADE_FAILED
    )
