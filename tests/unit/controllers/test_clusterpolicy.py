"""Pure parts of the ClusterPolicy reconcile: the singleton rule, ownership and hashing."""

from __future__ import annotations

import pydantic
import pytest

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.apply import with_ownership
from gpu_operator.controllers.queries import active_policy, validation_message
from gpu_operator.controllers.views import ClusterPolicyView, NodeView, OwnedView
from gpu_operator.vocabulary import HASH_ANNOTATION


def policy(name: str, created: str, uid: str = "u") -> ClusterPolicyView:
    return ClusterPolicyView(name, uid, 1, created, {"metadata": {"name": name}, "spec": {}})


def test_oldest_policy_is_active_name_breaks_ties() -> None:
    a = policy("b-policy", "2026-01-01T00:00:00Z")
    b = policy("a-policy", "2026-01-01T00:00:00Z")
    c = policy("z-policy", "2025-12-31T00:00:00Z")
    assert active_policy([a, b, c]) is c
    assert active_policy([a, b]) is b
    assert active_policy([]) is None


def test_ownership_and_hash_are_deterministic() -> None:
    obj = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x", "namespace": "ns"}}
    owned = with_ownership(obj, policy("p", "t", uid="123"))
    ref = owned["metadata"]["ownerReferences"][0]
    assert ref["uid"] == "123" and ref["controller"] is True and ref["kind"] == "ClusterPolicy"
    assert owned == with_ownership(obj, policy("p", "t", uid="123"))
    changed = with_ownership({**obj, "automountServiceAccountToken": False}, policy("p", "t", uid="123"))
    assert (
        changed["metadata"]["annotations"][HASH_ANNOTATION]
        != owned["metadata"]["annotations"][HASH_ANNOTATION]
    )
    assert "ownerReferences" not in obj["metadata"]  # the rendered object is not mutated


def test_owned_view_reads_hash_and_controller_owner() -> None:
    view = OwnedView.of(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": "d",
                "namespace": "ns",
                "uid": "1",
                "generation": 2,
                "annotations": {HASH_ANNOTATION: "abc"},
                "ownerReferences": [{"uid": "p1", "controller": True}, {"uid": "other"}],
            },
            "status": {"desiredNumberScheduled": 1},
        }
    )
    assert view.owner_uids == ("p1",) and view.applied_hash == "abc"
    assert view.key == ("apps", "DaemonSet", "ns", "d")
    assert view.readiness is not None and view.readiness["status"]["desiredNumberScheduled"] == 1


def test_node_view_keeps_only_relevant_labels() -> None:
    view = NodeView.of(
        {
            "metadata": {
                "name": "n",
                "labels": {
                    "feature.node.kubernetes.io/pci-10de.present": "true",
                    "nvidia.com/gpu.present": "true",
                    "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
                    "team": "ml",
                },
            },
            "status": {"nodeInfo": {"containerRuntimeVersion": "containerd://1.7", "kernelVersion": "6.8"}},
        }
    )
    assert set(view.labels) == {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"}
    assert view.gpu_present and view.has_nfd
    assert view.facts.runtime_version == "containerd://1.7" and view.facts.kernel == "6.8"
    assert view.facts is view.facts and view.facts.gpu  # built once per view


def test_validation_message_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        ClusterPolicy.model_validate({"spec": {"sandboxWorkloads": {"defaultWorkload": "bogus"}}})
    message = validation_message(err.value)
    assert message.startswith("spec.sandboxWorkloads.defaultWorkload")
