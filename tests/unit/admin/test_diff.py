"""`gpu-operator diff`'s pure parts: what the server sets is left out of both sides, the output is
kubectl diff's (a header per object, a unified diff of the YAML), and a proposed policy takes the
active one's identity (it would replace its spec)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpu_operator.admin.diff import (
    CHANGE,
    CREATE,
    NEW_POLICY_UID,
    DiffError,
    ObjectDiff,
    _policy_view,
    comparable,
)
from gpu_operator.controllers.views import ClusterPolicyView
from gpu_operator.kube.client import ObjectKey

LIVE: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {
        "name": "nvidia-device-plugin-daemonset",
        "namespace": "gpu-operator",
        "uid": "u1",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "managedFields": [{"manager": "gpu-operator"}],
        "annotations": {"deprecated.daemonset.template.generation": "3", "a": "b"},
    },
    "spec": {"template": {"spec": {"containers": [{"name": "p", "image": "i:1"}]}}},
    "status": {"numberReady": 1},
}


def test_what_the_server_sets_is_left_out() -> None:
    assert comparable(LIVE) == {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvidia-device-plugin-daemonset",
            "namespace": "gpu-operator",
            "annotations": {"a": "b"},
        },
        "spec": {"template": {"spec": {"containers": [{"name": "p", "image": "i:1"}]}}},
    }
    assert LIVE["status"] == {"numberReady": 1}  # the input is not changed


def test_the_text_is_a_unified_diff_per_object_as_kubectl_names_it() -> None:
    after = comparable(LIVE)
    after["spec"]["template"]["spec"]["containers"][0]["image"] = "i:2"
    one = ObjectDiff(
        ObjectKey("apps/v1", "DaemonSet", "nvidia-device-plugin-daemonset", "gpu-operator"),
        CHANGE,
        comparable(LIVE),
        after,
    )
    lines = one.text().splitlines()
    name = "apps.v1.DaemonSet.gpu-operator.nvidia-device-plugin-daemonset"
    assert lines[:3] == [f"diff -u -N LIVE/{name} MERGED/{name}", f"--- LIVE/{name}", f"+++ MERGED/{name}"]
    assert [yaml.safe_load(line[1:]) for line in lines[3:] if line[:1] in "+-"] == [
        [{"image": "i:1"}],
        [{"image": "i:2"}],
    ]


def test_a_created_object_has_only_added_lines() -> None:
    one = ObjectDiff(
        ObjectKey("v1", "ServiceAccount", "x", "ns"),
        CREATE,
        None,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x", "namespace": "ns"}},
    )
    body = [line for line in one.text().splitlines()[3:] if not line.startswith("@@")]
    assert body and all(line.startswith("+") for line in body)
    assert (
        one.text().splitlines()[0] == "diff -u -N LIVE/v1.ServiceAccount.ns.x MERGED/v1.ServiceAccount.ns.x"
    )


def test_a_proposed_policy_takes_the_active_ones_identity() -> None:
    live = ClusterPolicyView.of(
        {"metadata": {"name": "cluster-policy", "uid": "live-uid", "creationTimestamp": "t"}, "spec": {}}
    )
    proposed = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "other"},
        "spec": {"devicePlugin": {"enabled": False}},
    }
    view = _policy_view(proposed, live)
    assert (view.name, view.uid, view.body["spec"]) == ("cluster-policy", "live-uid", proposed["spec"])
    assert _policy_view(proposed, None).uid == NEW_POLICY_UID
    assert _policy_view(None, live) is live


@pytest.mark.parametrize(
    ("proposed", "live", "names"),
    [
        (None, None, "--policy FILE"),
        ({"kind": "ConfigMap"}, None, "not a ClusterPolicy"),
    ],
)
def test_no_policy_to_diff_is_an_error_naming_the_fix(
    proposed: dict[str, Any] | None, live: None, names: str
) -> None:
    with pytest.raises(DiffError) as err:
        _policy_view(proposed, live)
    assert names in str(err.value)
