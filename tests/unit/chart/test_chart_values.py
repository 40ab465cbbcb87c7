"""Values written for NVIDIA's chart work unchanged; what we cannot honour is reported; bad values fail clearly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helm_python import HelmRenderError

from tests.support.chart import CHART, Rendered, Values, find, notes, objects
from tests.unit.chart.test_chart_render import pruned

UPSTREAM_VALUES = Path(__file__).parent / "data" / "upstream-values.yaml"
OUR_IMAGE = "ghcr.io/gpu-operator-py/gpu-operator:0.1.0"


def upstream_values() -> Values:
    loaded: Values = yaml.safe_load(UPSTREAM_VALUES.read_text())
    return loaded


def report(rendered: Rendered) -> list[dict[str, Any]]:
    text = find(rendered, "ConfigMap", "gpu-operator-values-report")["data"]["unsupported.yaml"]
    entries: list[dict[str, Any]] = yaml.safe_load(text)
    return entries


def test_upstream_values_file_renders_the_same_policy_as_our_defaults(
    render: Callable[..., Rendered],
) -> None:
    ours = find(render(), "ClusterPolicy", "cluster-policy")["spec"]
    theirs = find(render(upstream_values()), "ClusterPolicy", "cluster-policy")["spec"]
    # Only the images of the operator's own agents differ, and those are replaced by ours.
    assert theirs == ours
    assert theirs["validator"]["repository"] == "ghcr.io/gpu-operator-py"
    assert theirs["driver"]["upgradePolicy"]["podDeletion"] == {
        "force": False,
        "timeoutSeconds": 300,
        "deleteEmptyDir": False,
    }
    assert "gpuPodDeletion" not in theirs["driver"]["upgradePolicy"]


def test_upstream_values_file_reports_only_the_replaced_images(render: Callable[..., Rendered]) -> None:
    rendered = render(upstream_values())
    assert [entry["key"] for entry in report(rendered)] == [
        "node-feature-discovery",  # NFD's subchart values: not shipped here
        "operator.repository/operator.image",
        "validator.repository/validator.image",
        "nodeStatusExporter.repository/nodeStatusExporter.image",
    ]
    (container,) = find(rendered, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == OUR_IMAGE
    assert "NVIDIA's Go operator image cannot run this operator" in notes(rendered)


def test_a_version_pinned_for_nvidias_image_is_not_used_on_ours(render: Callable[..., Rendered]) -> None:
    values = upstream_values()
    values["operator"]["version"] = values["validator"]["version"] = "v26.7.0"
    rendered = render(values)
    (container,) = find(rendered, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == OUR_IMAGE
    assert find(rendered, "ClusterPolicy", "cluster-policy")["spec"]["validator"]["version"] == "0.1.0"


def test_our_image_can_be_moved_and_pinned(render: Callable[..., Rendered]) -> None:
    rendered = render(
        {
            "operator": {"repository": "registry.corp/mirror", "version": "0.1.1"},
            "validator": {"repository": "nvcr.io/nvidia", "image": "gpu-operator"},
        }
    )
    (container,) = find(rendered, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.corp/mirror/gpu-operator:0.1.1"
    validator = find(rendered, "ClusterPolicy", "cluster-policy")["spec"]["validator"]
    assert (validator["repository"], validator["image"], validator["version"]) == (
        "registry.corp/mirror",
        "gpu-operator",
        "0.1.1",
    )


def test_user_overrides_land_in_the_policy(render: Callable[..., Rendered]) -> None:
    k3s = [
        {"name": "CONTAINERD_CONFIG", "value": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"},
        {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"},
    ]
    spec = find(
        render(
            {
                "driver": {"version": "580.65.06", "upgradePolicy": {"gpuPodDeletion": {"force": True}}},
                "toolkit": {"env": k3s},
                "mig": {"strategy": "mixed"},
                "daemonsets": {"updateStrategy": "OnDelete", "labels": {"team": "ml"}},
                "dcgmExporter": {"serviceMonitor": {"additionalLabels": {"release": "prom"}}},
                "hostPaths": {"kubeletRootDir": "/var/lib/k0s/kubelet"},
                "operator": {"runtimeClass": "nvidia-custom"},
            }
        ),
        "ClusterPolicy",
        "cluster-policy",
    )["spec"]
    assert spec["driver"]["version"] == "580.65.06"
    assert spec["driver"]["upgradePolicy"]["podDeletion"]["force"] is True
    assert spec["toolkit"]["env"] == k3s
    assert spec["mig"]["strategy"] == "mixed"
    assert spec["daemonsets"]["updateStrategy"] == "OnDelete"
    assert "rollingUpdate" not in spec["daemonsets"]
    assert spec["daemonsets"]["labels"] == {"team": "ml"}
    assert spec["dcgmExporter"]["serviceMonitor"]["additionalLabels"] == {"release": "prom"}
    assert spec["hostPaths"]["kubeletRootDir"] == "/var/lib/k0s/kubelet"
    assert spec["operator"] == {"runtimeClass": "nvidia-custom", "use_ocp_driver_toolkit": False}


def test_nvidia_driver_crd_mode_drops_the_driver_image(render: Callable[..., Rendered]) -> None:
    rendered = render({"driver": {"nvidiaDriverCRD": {"enabled": True}}})
    driver = find(rendered, "ClusterPolicy", "cluster-policy")["spec"]["driver"]
    assert driver["useNvidiaDriverCRD"] is True
    assert not {"repository", "image", "version", "nvidiaDriverCRD"} & set(driver)
    assert report(rendered) == []


def test_nvidia_driver_crd_mode_deploys_the_default_nvidiadriver(render: Callable[..., Rendered]) -> None:
    from gpu_operator.api.nvidiadriver import NVIDIADriver
    from gpu_operator.render.nvidiadriver import image_reference

    values = {
        "driver": {
            "nvidiaDriverCRD": {"enabled": True},
            "version": "570.172.08",
            "kernelModuleType": "open",
            "licensingConfig": {"configMapName": "licensing", "nlsEnabled": True},
            "repoConfig": {"configMapName": "repos"},
        },
        "gds": {"enabled": True},
    }
    spec = find(render(values), "NVIDIADriver", "default")["spec"]
    assert spec["default"] is True and "nodeSelector" not in spec
    assert (
        spec["version"] == "570.172.08" and spec["kernelModuleType"] == "open" and spec["driverType"] == "gpu"
    )
    assert spec["upgradePolicy"]["autoUpgrade"] is True and "gpuPodDeletion" not in spec["upgradePolicy"]
    assert spec["upgradePolicy"]["podDeletion"]["timeoutSeconds"] == 300
    assert spec["licensingConfig"] == {"name": "licensing", "secretName": "", "nlsEnabled": True}
    assert spec["repoConfig"] == {"name": "repos"} and spec["gds"]["enabled"] is True
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    obj = find(render(values), "NVIDIADriver", "default")
    crd = yaml.safe_load((CHART / "crds" / "nvidia.com_nvidiadrivers.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(obj, schema)
    assert pruned(obj["spec"], schema["properties"]["spec"], "spec") == []
    model = NVIDIADriver.model_validate(obj)
    assert model.warnings() == []
    assert image_reference(model.spec) == "nvcr.io/nvidia/driver:570.172.08"
    pooled = render(
        {
            "driver": {
                "nvidiaDriverCRD": {"enabled": True, "nodeSelector": {"pool": "a"}, "driverType": "vgpu"}
            }
        }
    )
    spec = find(pooled, "NVIDIADriver", "default")["spec"]
    assert spec["nodeSelector"] == {"pool": "a"} and "default" not in spec and spec["driverType"] == "vgpu"
    for more in (
        {"driver": {"nvidiaDriverCRD": {"enabled": True, "deployDefaultCR": False}}},
        {"driver": {"enabled": False, "nvidiaDriverCRD": {"enabled": True}}},  # as NVIDIA's chart
        {},
    ):
        assert not [o for o in objects(render(more)) if o["kind"] == "NVIDIADriver"]


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"nfd": {"nodefeaturerules": True}}, "nfd.nodefeaturerules"),
        ({"kataManager": {"enabled": True}}, "kataManager.enabled"),
        ({"platform": {"openshift": True}}, "platform.openshift"),
        ({"operator": {"defaultGPUMode": "vm-passthrough"}}, "operator.defaultGPUMode"),
        ({"operator": {"logging": {"develMode": True}}}, "operator.logging.develMode"),
        ({"operator": {"replica": 2}}, "operator.replica"),
        ({"psp": {"enabled": True}}, "psp"),
        # NFD is not shipped: its subchart values (in NVIDIA's values files) are reported, not dropped silently
        ({"node-feature-discovery": {"worker": {"tolerations": []}}}, "node-feature-discovery"),
        ({"someFutureKey": {"a": 1}}, "someFutureKey"),
        # a key under a component that the ClusterPolicy CRD does not define would be pruned
        ({"driver": {"someFutureField": True}}, "spec.driver.someFutureField"),
        (
            {"toolkit": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {}}}]}},
            "spec.toolkit.env[0].valueFrom",
        ),
    ],
)
def test_unsupported_values_are_reported(values: Values, key: str, render: Callable[..., Rendered]) -> None:
    rendered = render(values)
    assert [entry["key"] for entry in report(rendered)] == [key]
    assert f"  - {key}=" in notes(rendered)


def test_cleanup_crd_deletes_our_crds_in_the_pre_delete_hook(render: Callable[..., Rendered]) -> None:
    def hook(values: Values) -> tuple[list[str], list[dict[str, Any]]]:
        rendered = render(values)
        job = find(rendered, "Job", "gpu-operator-cleanup")
        role = find(rendered, "ClusterRole", "gpu-operator-cleanup")
        return job["spec"]["template"]["spec"]["containers"][0]["command"], role["rules"]

    command, rules = hook({"operator": {"cleanupCRD": True}})
    assert command == ["gpu-operator", "cleanup", "--operator-deployment=gpu-operator", "--crds"]
    assert {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": [
            "clusterpolicies.nvidia.com",  # ours: the chart's crds/nvidia.com_*.yaml, by name
            "gpuclusters.nvidia.com",
            "nvidiadrivers.nvidia.com",
            "computedomains.resource.nvidia.com",
            "computedomaincliques.resource.nvidia.com",
        ],
        "verbs": ["get", "delete"],
    } in rules  # get: a CRD another Helm release owns stays
    command, rules = hook({})
    assert command == ["gpu-operator", "cleanup", "--operator-deployment=gpu-operator"]
    assert not [r for r in rules if "apiextensions.k8s.io" in r["apiGroups"]]
    assert report(render({"operator": {"cleanupCRD": True}})) == []


def test_defaults_report_nothing(render: Callable[..., Rendered]) -> None:
    rendered = render()
    assert report(rendered) == []
    assert "WARNING" not in notes(rendered)


CHECKS = [
    ({"gpuCluster": {"deployCR": True}}, r"clusterPolicy\.deployCR and gpuCluster\.deployCR are both true"),
    (
        {"clusterPolicy": {"deployCR": False}, "gpuCluster": {"deployCR": True}},
        r"resource\.k8s\.io/v1 DeviceClass API",
    ),
    (
        {"cdi": {"enabled": False, "nriPluginEnabled": True}},
        r"cdi\.nriPluginEnabled=true requires cdi\.enabled=true",
    ),
    (
        {"cdi": {"nriPluginEnabled": True}, "toolkit": {"enabled": False}},
        r"cdi\.nriPluginEnabled=true requires toolkit\.enabled=true",
    ),
    (
        {"devicePlugin": {"config": {"create": True, "data": {"a": "b"}}}},
        r"devicePlugin\.config\.create=true requires devicePlugin\.config\.name",
    ),
    (
        {"devicePlugin": {"config": {"create": True, "name": "cfg"}}},
        r"devicePlugin\.config\.create=true requires devicePlugin\.config\.data",
    ),
    (
        {"migManager": {"config": {"create": True, "name": "cfg"}}},
        r"migManager\.config\.create=true requires migManager\.config\.data",
    ),
    (
        {"sandboxWorkloads": {"enabled": True}, "vgpuManager": {"enabled": True}},
        r"needs vgpuManager\.repository and vgpuManager\.version",
    ),
    (
        {"sandboxWorkloads": {"defaultWorkload": "vm"}},
        r'sandboxWorkloads\.defaultWorkload="vm" is not a workload config',
    ),
    (
        {"sandboxWorkloads": {"mode": "firecracker"}},
        r"sandboxWorkloads\.mode=\"firecracker\" is not supported",
    ),
    ({"daemonsets": {"updateStrategy": "Recreate"}}, r"daemonsets\.updateStrategy=\"Recreate\""),
    ({"mig": {"strategy": "all"}}, r"mig\.strategy=\"all\" is not a MIG strategy"),
    ({"driver": {"kernelModuleType": "closed"}}, r"driver\.kernelModuleType=\"closed\""),
    ({"operator": {"repository": "", "image": ""}}, r"operator\.repository and operator\.image must name"),
    ({"operator": {"logging": {"level": "trace"}}}, r"operator\.logging\.level=\"trace\" is not a log level"),
    ({"operator": {"replicas": "two"}}, r"operator\.replicas=two is not a pod count"),
    ({"operator": {"replicas": 1.5}}, r"operator\.replicas=1\.5 is not a pod count"),
    ({"operator": {"replicas": -1}}, r"operator\.replicas=-1 is not a pod count"),
]


@pytest.mark.parametrize(("values", "message"), CHECKS, ids=[m.split("\\")[0] for _, m in CHECKS])
def test_bad_values_fail_with_the_key_and_the_fix(
    values: Values, message: str, render: Callable[..., Rendered]
) -> None:
    with pytest.raises(HelmRenderError, match=message):
        render(values)


def test_the_operator_log_level_comes_from_operator_logging_level(render: Callable[..., Rendered]) -> None:
    def args(values: Values) -> list[str]:
        deployment = find(render(values), "Deployment", "gpu-operator")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert args({})[-2:] == ["--log-level", "info"]
    assert args({"operator": {"logging": {"level": "debug"}}})[-2:] == ["--log-level", "debug"]


def test_operator_replicas_are_standbys_for_the_lease(render: Callable[..., Rendered]) -> None:
    deployment = find(render({"operator": {"replicas": 3}}), "Deployment", "gpu-operator")
    assert deployment["spec"]["replicas"] == 3
    assert "--leader-elect" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert find(render(), "Deployment", "gpu-operator")["spec"]["replicas"] == 1
