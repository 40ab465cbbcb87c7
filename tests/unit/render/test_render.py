"""The whole render: order, validity for Kubernetes 1.36, ownership, deletes, gates and errors."""

from __future__ import annotations

import functools
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest

from gpu_operator.render import RenderError, render
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import operator_env
from gpu_operator.vocabulary import MANAGED_BY, STATE_LABEL
from tests.unit.render.renderkit import IMAGES, STATE_NAMES, daemonset, facts, policy, run

UPSTREAM_ORDER = [
    "pre-requisites",
    "state-operator-metrics",
    "state-driver",
    "state-container-toolkit",
    "state-operator-validation",
    "state-device-plugin",
    "state-mps-control-daemon",
    "state-dcgm",
    "state-dcgm-exporter",
    "gpu-feature-discovery",
    "state-mig-manager",
    "state-node-status-exporter",
    "state-vgpu-manager",
    "state-vgpu-device-manager",
    "state-sandbox-validation",
    "state-vfio-manager",
    "state-sandbox-device-plugin",
    "state-kata-device-plugin",
    "state-kata-manager",
    "state-cc-manager",
]
# kubernetes-validate ships the built-in API schemas only. These kinds come from CRDs that are
# not part of Kubernetes (Prometheus operator, OpenShift), so they cannot be schema-checked here;
# their shape is asserted by dedicated tests instead.
CRD_KINDS = {"ServiceMonitor", "SecurityContextConstraints"}
# kubernetes-validate 1.37.0 ships schemas for 1.36.0 (the nearest to our 1.36 target).
SCHEMA_VERSION = "1.36.0"

EVERYTHING = {
    "operator": {"runtimeClass": "nvidia-custom"},
    "daemonsets": {
        "labels": {"team": "gpu"},
        "annotations": {"a": "b"},
        "priorityClassName": "high",
        "tolerations": [{"key": "x", "operator": "Exists"}],
        "rollingUpdate": {"maxUnavailable": "20%"},
        "podSecurityContext": {"runAsNonRoot": False},
    },
    "driver": {
        "rdma": {"enabled": True, "useHostMofed": True},
        "kernelModuleType": "open",
        "licensingConfig": {"secretName": "lic", "nlsEnabled": True},
        "secretEnv": "driver-env",
        "virtualTopology": {"config": "topo"},
        "kernelModuleConfig": {"name": "kmods"},
        "repoConfig": {"configMapName": "repos"},
        "certConfig": {"name": "certs"},
        "manager": {"env": [{"name": "DRAIN_USE_FORCE", "value": "true"}]},
        "upgradePolicy": {"autoUpgrade": True, "drain": {"enable": True, "timeoutSeconds": 60}},
        "startupProbe": {"failureThreshold": 10},
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
        "args": ["--x"],
        "env": [{"name": "A", "value": "1"}],
    },
    "toolkit": {
        "installDir": "/opt/nvidia",
        "env": [
            {"name": "CONTAINERD_CONFIG", "value": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"}
        ],
    },
    "devicePlugin": {
        "config": {"name": "dp-config", "default": "a100"},
        "mps": {"root": "/run/mps"},
        "hostNetwork": True,
    },
    "dcgmExporter": {
        "serviceMonitor": {"enabled": True, "interval": "30s"},
        "enablePodLabels": True,
        "hpcJobMapping": {"enabled": True},
        "config": {"name": "metrics"},
        "service": {"type": "NodePort", "internalTrafficPolicy": "Local"},
    },
    "dcgm": {"hostPort": 5555},
    "nodeStatusExporter": {"enabled": True},
    "mig": {"strategy": "mixed"},
    "migManager": {"config": {"name": "mig-cfg"}, "gpuClientsConfig": {"name": "clients"}},
    "gds": {"enabled": True},
    "gdrcopy": {"enabled": True},
    "hostPaths": {"rootFS": "/host-root", "driverInstallDir": "/opt/driver"},
    "validator": {"plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]}},
}
CONFIGMAP_KEYS = {"repos": ("cuda.list",), "certs": ("corp.crt",)}


# kubernetes-validate re-reads its multi-megabyte definitions file for every object; the schema
# files never change during a run, so read each once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)


def _validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


def test_twenty_states_in_upstream_order() -> None:
    assert list(STATE_NAMES) == UPSTREAM_ORDER
    assert [s.name for s in run().states] == UPSTREAM_ORDER


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ({}, {}),
        (EVERYTHING, {"configmap_keys": CONFIGMAP_KEYS}),
        (
            {
                "sandboxWorkloads": {"enabled": True},
                "vfioManager": {"enabled": True},
                "sandboxDevicePlugin": {"enabled": True},
                "vgpuManager": {"enabled": True},
                "vgpuDeviceManager": {"enabled": True},
            },
            {},
        ),
        (
            {
                "sandboxWorkloads": {"enabled": True, "mode": "kata"},
                "kataSandboxDevicePlugin": {"enabled": True},
                "ccManager": {"enabled": True, "defaultMode": "devtools"},
            },
            {},
        ),
        ({"cdi": {"nriPluginEnabled": True}}, {}),
        ({"driver": {"usePrecompiled": True}}, {}),
        ({}, {"openshift": True, "openshift_version": "4.19"}),
    ],
)
def test_every_object_is_valid_for_kubernetes_1_36(spec: dict[str, Any], kwargs: dict[str, Any]) -> None:
    result = render(policy(spec), facts("dgx-h100:2", "host-driver:1", "cpu:1", **kwargs))
    objects = result.objects()
    assert objects
    _validate(objects)


def test_ownership_labels_namespaces_and_no_owner_references() -> None:
    result = run(EVERYTHING, configmap_keys=CONFIGMAP_KEYS)
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "RuntimeClass", "SecurityContextConstraints"}
    assert len(result.objects()) > 20
    for state in result.states:
        for obj in state.objects:
            meta = obj["metadata"]
            assert meta["labels"][MANAGED_BY] == "gpu-operator"
            assert meta["labels"][STATE_LABEL] == state.name
            assert "ownerReferences" not in meta
            assert ("namespace" in meta) == (obj["kind"] not in cluster_scoped), obj["kind"]


def test_apply_order_puts_rbac_first_and_daemonsets_last() -> None:
    kinds = [o["kind"] for o in run().state("state-device-plugin").objects]
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"]
    kinds = [o["kind"] for o in run().state("state-mig-manager").objects]
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
    ]


def test_default_policy_enables_the_container_stack_only() -> None:
    enabled = [s.name for s in run().states if s.enabled]
    assert enabled == UPSTREAM_ORDER[:11]


def test_disabled_states_render_nothing() -> None:
    # What a disabled state owned is deleted by the operator: it is not in the apply set.
    result = run()
    state = result.state("state-vfio-manager")
    assert not state.enabled and state.objects == []
    assert not any(o["metadata"]["name"] == "nvidia-vfio-manager" for o in result.objects())


def test_enabled_state_renders_only_what_it_wants() -> None:
    state = run({"cdi": {"enabled": False}}).state("pre-requisites")
    assert [o["metadata"]["name"] for o in state.objects] == ["nvidia"]
    assert run({"cdi": {"enabled": True}}).keep_kinds == frozenset()


def test_no_gpu_node_leaves_daemonsets_out() -> None:
    result = render(policy(), facts("cpu:2"))
    for state in result.states:
        assert all(o["kind"] != "DaemonSet" for o in state.objects)
    assert result.keep_kinds == frozenset({"DaemonSet"})  # the operator leaves live ones alone
    assert "no node has nvidia.com/gpu.present=true" in result.state("state-driver").reason
    assert result.state("state-driver").objects  # RBAC and config maps are still applied


def test_unlabelled_nodes_are_not_gpu_nodes() -> None:
    result = render(policy(), facts("dgx-h100:1", labelled=False))
    assert not any(o["kind"] == "DaemonSet" for o in result.objects())


def test_servicemonitors_skipped_without_their_crd() -> None:
    spec = {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}
    with_crd = run(spec)
    without = run(spec, servicemonitor_crd=False)
    assert any(o["kind"] == "ServiceMonitor" for o in with_crd.objects())
    assert not any(o["kind"] == "ServiceMonitor" for o in without.objects())


def test_servicemonitor_shape() -> None:
    monitor = next(
        o
        for o in run({"dcgmExporter": {"serviceMonitor": {"enabled": True, "interval": "30s"}}})
        .state("state-dcgm-exporter")
        .objects
        if o["kind"] == "ServiceMonitor"
    )
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    assert monitor["spec"]["endpoints"][0] == {"port": "gpu-metrics", "path": "/metrics", "interval": "30s"}


def test_openshift_adds_sccs_that_name_the_service_account() -> None:
    result = run({}, openshift=True)
    scc = next(o for o in result.state("state-driver").objects if o["kind"] == "SecurityContextConstraints")
    assert scc["users"] == ["system:serviceaccount:gpu-operator:nvidia-driver"]
    assert scc["allowPrivilegedContainer"] is True


def test_missing_image_names_the_field_and_env() -> None:
    env = {k: v for k, v in IMAGES.items() if k != "DEVICE_PLUGIN_IMAGE"}
    with pytest.raises(RenderError) as err:
        render(policy(), facts("dgx-h100:1", operator_env=env))
    assert err.value.field_path == "spec.devicePlugin"
    assert "DEVICE_PLUGIN_IMAGE" in err.value.message


def test_operator_env_one_rule_for_the_operator_and_offline_rendering() -> None:
    environ = {
        "DRIVER_IMAGE": "r.example/driver:1",
        "GDS_IMAGE": "",
        "OPERATOR_NAMESPACE": "gpu-operator",
        "PATH": "/bin",
    }
    # The operator: its non-empty *_IMAGE variables, nothing else.
    assert operator_env(environ) == {"DRIVER_IMAGE": "r.example/driver:1"}
    # `gpu-operator render`: the same variables over the chart's images; an empty one does not
    # blank a default.
    offline = operator_env(environ, CHART_DEFAULT_IMAGES)
    assert offline["DRIVER_IMAGE"] == "r.example/driver:1"
    assert offline["GDS_IMAGE"] == CHART_DEFAULT_IMAGES["GDS_IMAGE"]
    assert set(offline) == set(CHART_DEFAULT_IMAGES)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cdi": {"enabled": False, "nriPluginEnabled": True}}, "spec.cdi.nriPluginEnabled"),
        ({"toolkit": {"enabled": False}, "cdi": {"nriPluginEnabled": True}}, "spec.cdi.nriPluginEnabled"),
        ({"driver": {"usePrecompiled": True}, "gds": {"enabled": True}}, "spec.driver.usePrecompiled"),
        ({"driver": {"repoConfig": {"configMapName": "r"}}}, "spec.driver.repoConfig.configMapName"),
        ({"devicePlugin": {"config": {"default": "x"}}}, "spec.devicePlugin.config.default"),
    ],
)
def test_unrenderable_policies_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(RenderError) as err:
        run(spec)
    assert err.value.field_path == field
    assert ":" in str(err.value)


def test_unknown_fields_become_warnings() -> None:
    result = run({"newThing": {"enabled": True}})
    assert result.warnings == [
        "unknown field 'spec.newThing' in ClusterPolicy 'cluster-policy': kept, but ignored"
    ]


def test_precompiled_driver_fans_out_per_kernel_and_deletes_the_other_variant() -> None:
    result = run({"driver": {"usePrecompiled": True, "version": "595"}}, "dgx-h100:1", "host-driver:1")
    state = result.state("state-driver")
    names = sorted(o["metadata"]["name"] for o in state.objects if o["kind"] == "DaemonSet")
    assert names == [
        "nvidia-driver-daemonset-5.15.0-119-generic-ubuntu22.04",
        "nvidia-driver-daemonset-6.8.0-48-generic-ubuntu22.04",
    ]
    assert (
        "nvidia-driver-daemonset" not in names
    )  # the other variant is not rendered: the operator deletes it
    ds = daemonset(result, "state-driver", names[0])
    assert (
        ds["spec"]["template"]["spec"]["nodeSelector"]["feature.node.kubernetes.io/kernel-version.full"]
        == "5.15.0-119-generic"
    )
    assert ds["metadata"]["labels"]["nvidia.com/precompiled"] == "true"
    # the version is the branch: NVIDIA's precompiled images are tagged <branch>-<kernel>-<os>
    assert (
        ds["spec"]["template"]["spec"]["containers"][0]["image"]
        == "nvcr.io/nvidia/driver:595-5.15.0-119-generic-ubuntu22.04"
    )


def test_use_nvidia_driver_crd_disables_the_driver_state() -> None:
    state = run({"driver": {"useNvidiaDriverCRD": True}}).state("state-driver")
    assert not state.enabled and "Orphan" in state.reason
    assert state.objects == [] and state.orphan_pods


def test_bidirectional_mounts_only_in_privileged_containers() -> None:
    # the apiserver rejects pods whose unprivileged containers ask for Bidirectional propagation
    result = run(EVERYTHING, configmap_keys=CONFIGMAP_KEYS)
    bidirectional = [
        m
        for o in result.objects()
        if o["kind"] == "DaemonSet"
        for c in o["spec"]["template"]["spec"]["containers"]
        for m in c.get("volumeMounts", [])
        if m.get("mountPropagation") == "Bidirectional"
    ]
    assert bidirectional, "no Bidirectional mount rendered: the check below would check nothing"
    for obj in result.objects():
        if obj["kind"] != "DaemonSet":
            continue
        pod = obj["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            privileged = c.get("securityContext", {}).get("privileged", False)
            for m in c.get("volumeMounts", []):
                assert privileged or m.get("mountPropagation") != "Bidirectional", (
                    obj["metadata"]["name"],
                    c["name"],
                )


def test_the_schema_check_catches_a_broken_object() -> None:
    ds = daemonset(run(), "state-device-plugin")
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate([ds])
