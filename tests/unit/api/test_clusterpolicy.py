"""ClusterPolicy/NVIDIADriver models: defaults, round-trips and unknown fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.nvidiadriver import NVIDIADriver

# The shape an upstream Helm install creates (keys and values from the upstream chart defaults),
# plus fields this release does not know.
UPSTREAM = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy", "uid": "u-1", "managedFields": [{"manager": "helm"}]},
    "spec": {
        "operator": {
            "defaultRuntime": "containerd",
            "runtimeClass": "nvidia",
            "use_ocp_driver_toolkit": False,
        },
        "daemonsets": {
            "priorityClassName": "system-node-critical",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "updateStrategy": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "1"},
        },
        "driver": {
            "enabled": True,
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": "595.91.07",
            "startupProbe": {
                "initialDelaySeconds": 60,
                "periodSeconds": 10,
                "timeoutSeconds": 60,
                "failureThreshold": 120,
            },
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxUnavailable": "25%",
                "podDeletion": {"force": False, "timeoutSeconds": 300},
            },
            "licensingConfig": {"secretName": "", "nlsEnabled": True},
            "futureKnob": {"x": 1},
        },
        "toolkit": {"enabled": True, "installDir": "/usr/local/nvidia"},
        "devicePlugin": {"enabled": True, "mps": {"root": "/run/nvidia/mps"}},
        "dcgm": {"enabled": False},
        "dcgmExporter": {"enabled": True, "serviceMonitor": {"enabled": True, "interval": "15s"}},
        "gfd": {"enabled": True},
        "nodeStatusExporter": {"enabled": False},
        "mig": {"strategy": "single"},
        "migManager": {"enabled": True, "config": {"default": "all-disabled", "name": ""}},
        "cdi": {"enabled": True, "nriPluginEnabled": False},
        "sandboxWorkloads": {"enabled": False, "defaultWorkload": "container", "mode": "kubevirt"},
        "hostPaths": {"rootFS": "/", "driverInstallDir": "/run/nvidia/driver"},
        "gpuClusterThing": {"enabled": True},
    },
    "status": {
        "state": "ready",
        "namespace": "gpu-operator",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}],
    },
}


def test_upstream_policy_loads_and_round_trips() -> None:
    policy = ClusterPolicy.model_validate(UPSTREAM)
    assert policy.dump() == UPSTREAM


def test_unknown_fields_are_kept_and_reported() -> None:
    policy = ClusterPolicy.model_validate(UPSTREAM)
    warnings = policy.warnings()
    assert any("'spec.gpuClusterThing'" in w for w in warnings)
    assert any("'spec.driver.futureKnob'" in w for w in warnings)
    assert not any("managedFields" in w for w in warnings)  # metadata is not ours to judge
    assert policy.spec.driver.model_extra == {"futureKnob": {"x": 1}}


@pytest.mark.parametrize(
    ("getter", "expected"),
    [
        (lambda s: s.operator.runtimeClass, "nvidia"),
        (lambda s: s.daemonsets.updateStrategy, "RollingUpdate"),
        (lambda s: s.driver.on(), True),
        (lambda s: s.driver.kernelModuleType, "auto"),
        (lambda s: s.toolkit.on(), True),
        (lambda s: s.toolkit.installDir, "/usr/local/nvidia"),
        (lambda s: s.devicePlugin.on(), True),
        (lambda s: s.dcgm.on(), True),
        (lambda s: s.dcgmExporter.on(), True),
        (lambda s: s.gfd.on(), True),
        (lambda s: s.migManager.on(), True),
        (lambda s: s.nodeStatusExporter.on(), False),
        (lambda s: s.gds.on(), False),
        (lambda s: s.gdrcopy.on(), False),
        (lambda s: s.vgpuManager.on(), False),
        (lambda s: s.ccManager.on(), False),
        (lambda s: s.cdi.on(), True),
        (lambda s: s.cdi.nri(), False),
        (lambda s: s.sandbox_on(), False),
        (lambda s: s.sandboxWorkloads.defaultWorkload, "container"),
        (lambda s: s.sandboxWorkloads.mode, "kubevirt"),
        (lambda s: s.hostPaths.root(), "/"),
        (lambda s: s.hostPaths.driver_install_dir(), "/run/nvidia/driver"),
        (lambda s: s.hostPaths.kubeletRootDir, "/var/lib/kubelet"),
        (lambda s: s.default_workload(), "container"),
        (lambda s: s.driver_auto_upgrade(), False),
    ],
)
def test_defaults_of_an_empty_spec(getter, expected) -> None:  # type: ignore[no-untyped-def]
    assert getter(ClusterPolicy().spec) == expected


def test_default_workload_only_counts_with_sandbox_on() -> None:
    spec = ClusterPolicy.model_validate(
        {"spec": {"sandboxWorkloads": {"defaultWorkload": "vm-passthrough"}}}
    ).spec
    assert spec.default_workload() == "container"
    spec.sandboxWorkloads.enabled = True
    assert spec.default_workload() == "vm-passthrough"


def test_enum_violation_names_the_field() -> None:
    with pytest.raises(ValidationError) as err:
        ClusterPolicy.model_validate({"spec": {"mig": {"strategy": "double"}}})
    assert "spec.mig.strategy" in str(err.value).replace("\n", ".")


def test_nvidiadriver_defaults_and_unknown_fields() -> None:
    driver = NVIDIADriver.model_validate(
        {"metadata": {"name": "default"}, "spec": {"default": True, "zzz": 1}}
    )
    assert driver.spec.driverType == "gpu"
    assert driver.spec.image == "nvcr.io/nvidia/driver"
    assert driver.warnings() == ["unknown field 'spec.zzz' in NVIDIADriver 'default': kept, but ignored"]
