"""ClusterPolicy spec.health (ours): defaults, refusals naming the field, the CRD's schema."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from gpu_operator.api import crdgen
from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.healthpolicy import DEFAULT_STARTUP_TAINT, HealthSpec, RemediationSpec


def _policy(health: dict[str, Any]) -> ClusterPolicy:
    return ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"health": health}})


def _locs(err: pydantic.ValidationError) -> list[tuple[str | int, ...]]:
    return [tuple(e["loc"]) for e in err.errors()]


def test_defaults_and_unset() -> None:
    unset = ClusterPolicy.model_validate({"metadata": {"name": "p"}, "spec": {}})
    assert unset.spec.health is None
    assert "health" not in unset.model_dump(exclude_unset=True)["spec"]
    spec = _policy({}).spec.health
    assert spec == HealthSpec()
    assert spec is not None
    assert spec.taintEffect == "NoSchedule"
    assert spec.startupTaint.enabled is False and spec.startupTaint.key == DEFAULT_STARTUP_TAINT
    r = spec.remediation
    assert (r.enabled, r.maxUnavailable, r.maxAttempts, r.drainTimeoutSeconds) == (False, 1, 3, 300)
    assert r.actions == ["restart-device-plugin", "reset-gpu", "reload-driver", "reboot"]


@pytest.mark.parametrize(
    ("health", "loc"),
    [
        (
            {"remediation": {"actions": ["reboot", "format-disk"]}},
            ("spec", "health", "remediation", "actions", 1),
        ),
        ({"remediation": {"maxUnavailable": "lots"}}, ("spec", "health", "remediation", "maxUnavailable")),
        ({"remediation": {"maxUnavailable": "150%"}}, ("spec", "health", "remediation", "maxUnavailable")),
        ({"taintEffect": "PreferNoSchedule"}, ("spec", "health", "taintEffect")),
        ({"startupTaint": {"key": "example.com/not-ready"}}, ("spec", "health", "startupTaint", "key")),
        ({"remediation": {"actions": ["external"]}}, ("spec", "health", "remediation")),
        ({"remediation": {"actions": ["reboot", "reboot"]}}, ("spec", "health", "remediation")),
        ({"remediation": {"podSelector": "bad key!=x"}}, ("spec", "health", "remediation", "podSelector")),
    ],
)
def test_bad_input_names_the_field(health: dict[str, Any], loc: tuple[str | int, ...]) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        _policy(health)
    assert loc in _locs(info.value)


def test_good_values() -> None:
    spec = _policy(
        {
            "taintEffect": "NoExecute",
            "remediation": {
                "enabled": True,
                "maxUnavailable": "10%",
                "actions": ["reset-gpu", "external"],
                "externalHandoff": {"label": "example.com/repair"},
                "podSelector": "team=ml,tier!=critical",
            },
        }
    ).spec.health
    assert spec is not None
    assert (
        spec.remediation.externalHandoff is not None and spec.remediation.externalHandoff.value == "requested"
    )
    assert spec.remediation.unavailable_limit(25) == 3  # 10% of 25 rounded up
    assert RemediationSpec(maxUnavailable="0%").unavailable_limit(25) == 0
    assert RemediationSpec(maxUnavailable=2).unavailable_limit(25) == 2
    assert RemediationSpec(maxUnavailable="2").unavailable_limit(25) == 2


def test_crd_schema_refuses_what_the_model_refuses() -> None:
    crd = crdgen.crds()["nvidia.com_clusterpolicies.yaml"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    remediation = spec["health"]["properties"]["remediation"]["properties"]
    assert remediation["actions"]["items"]["enum"] == [
        "restart-device-plugin",
        "reset-gpu",
        "reload-driver",
        "reboot",
        "external",
    ]
    assert remediation["actions"]["x-kubernetes-list-type"] == "set"
    assert remediation["maxUnavailable"]["x-kubernetes-int-or-string"] is True
    assert [r["rule"] for r in remediation["maxUnavailable"]["x-kubernetes-validations"]][0].startswith(
        "type(self) == int"
    )
    assert spec["health"]["properties"]["taintEffect"]["enum"] == ["NoSchedule", "NoExecute"]


@pytest.mark.parametrize(
    "key",
    [
        "readiness.k8s.io/nvidia-gpu-ready",  # the Node Readiness Controller's prefix (its CRD's rule)
        DEFAULT_STARTUP_TAINT,  # cluster-autoscaler's
        "nvidia.com/gpu-not-validated",
    ],
)
def test_a_startup_taint_under_an_allowed_prefix_is_taken(key: str) -> None:
    spec = _policy({"startupTaint": {"enabled": True, "key": key}}).spec.health
    assert spec is not None and spec.startupTaint.key == key


@pytest.mark.parametrize(
    "key",
    [
        "readiness.k8s.io.example.com/x",  # a look-alike domain, not the prefix
        "example.com/readiness.k8s.io",
        "node.kubernetes.io/not-ready",  # the kubelet's: never ours to remove
        "readiness.k8s.io/",  # no name
        "readiness.k8s.io/" + "n" * 64,  # a name part over 63 characters
    ],
)
def test_a_startup_taint_outside_the_prefixes_is_refused_naming_the_field(key: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        _policy({"startupTaint": {"key": key}})
    assert _locs(info.value) == [("spec", "health", "startupTaint", "key")]
