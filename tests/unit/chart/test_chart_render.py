"""The chart renders with real Helm for the defaults and every preset, lints clean, and every object is valid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.common import unknown_fields
from gpu_operator.controllers.customresources import CUSTOM_RESOURCES
from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET
from tests.support.chart import (
    CHART,
    NAMESPACE,
    PRESETS,
    VGPU_IMAGE,
    Rendered,
    Values,
    deep_merge,
    find,
    objects,
    preset,
)

# kubernetes-validate ships schemas up to 1.37; 1.36 is the release we target.
KUBE_VERSION = "1.36.0"


def shapes() -> list[tuple[str, Values]]:
    cases: list[tuple[str, Values]] = [("defaults", {})]
    for name in PRESETS:
        values = preset(name)
        cases.append((name, deep_merge(values, VGPU_IMAGE) if name == "vgpu" else values))
    return cases


SHAPES = shapes()
IDS = [name for name, _ in SHAPES]


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((CHART / "crds" / "nvidia.com_clusterpolicies.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def pruned(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Paths the API server would drop because the CRD's structural schema does not define them."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, child in value.items():
            if key in properties:
                found += pruned(child, properties[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                found += pruned(child, additional, f"{path}.{key}")
            elif not additional:
                found.append(f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += pruned(item, schema["items"], f"{path}[{index}]")
    return found


@pytest.mark.parametrize(("name", "values"), SHAPES, ids=IDS)
def test_lint_is_clean(name: str, values: Values) -> None:
    # NFD is not a dependency (nfd.enabled runs our discovery DaemonSet): nothing to fetch, nothing to warn
    report = helm_python.lint(
        CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}"
    )
    assert [m["error"] for m in report["messages"]] == [], report


@pytest.mark.parametrize(("name", "values"), SHAPES, ids=IDS)
def test_every_object_is_valid(name: str, values: Values, render: Callable[..., Rendered]) -> None:
    rendered = objects(render(values))
    kinds = sorted({o["kind"] for o in rendered})
    assert kinds == [
        "ClusterPolicy",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Job",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    schema = crd_schema()
    for obj in rendered:
        if obj["kind"] == "ClusterPolicy":
            jsonschema.validate(obj, schema)
            assert pruned(obj["spec"], schema["properties"]["spec"], "spec") == []
            model = ClusterPolicy.model_validate(obj)
            assert unknown_fields(model) == []
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_every_namespaced_object_is_in_the_release_namespace(render: Callable[..., Rendered]) -> None:
    cluster_scoped = {"ClusterPolicy", "ClusterRole", "ClusterRoleBinding"}
    namespaced = [o for o in objects(render(namespace="gpu-ops")) if o["kind"] not in cluster_scoped]
    assert len(namespaced) > 3
    for obj in objects(render(namespace="gpu-ops")):
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"]["namespace"] == "gpu-ops", obj["metadata"]


def test_operator_deployment(render: Callable[..., Rendered]) -> None:
    deployment = find(render(), "Deployment", "gpu-operator")
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == {
        "app": "gpu-operator",
        "app.kubernetes.io/component": "gpu-operator",
        "app.kubernetes.io/instance": deployment["metadata"]["labels"][
            "app.kubernetes.io/instance"
        ],  # the release
        "nvidia.com/gpu-driver-upgrade-drain.skip": "true",
    }
    assert deployment["metadata"]["labels"]["app.kubernetes.io/instance"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["serviceAccountName"] == "gpu-operator"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "ghcr.io/gpu-operator-py/gpu-operator:0.1.0"
    assert container["command"] == ["gpu-operator", "run"]
    # (rendered with nfd.enabled=false: NFD's master, not the operator, puts GFD's labels on Nodes)
    assert container["args"] == [
        "--namespace",
        NAMESPACE,
        "--leader-elect",
        "--metrics-bind-address",
        ":8080",
        "--health-probe-bind-address",
        ":8081",
        "--no-gfd-node-labels",
        "--log-level",
        "info",
    ]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["DRIVER_IMAGE"] == "nvcr.io/nvidia/driver:595.91.07"
    assert env["DRIVER_MANAGER_IMAGE"] == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
    assert env["VALIDATOR_IMAGE"] == "ghcr.io/gpu-operator-py/gpu-operator:0.1.0"
    assert env["CONTAINER_TOOLKIT_IMAGE"] == "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
    # The vGPU manager has no default image: no fallback rather than a bare name.
    assert "VGPU_MANAGER_IMAGE" not in env


def test_a_hand_run_operator_falls_back_to_the_images_the_chart_sets(render: Callable[..., Rendered]) -> None:
    from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES, missing_images

    (container,) = find(render(), "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # the chart's Deployment sets each fallback to the same image (CUDA_VALIDATOR_IMAGE: it leaves it
    # unset and the renderer uses the same default, CUDA_WORKLOAD_IMAGE)
    assert {k: v for k, v in env.items() if k in CHART_DEFAULT_IMAGES} == {
        k: v for k, v in CHART_DEFAULT_IMAGES.items() if k != "CUDA_VALIDATOR_IMAGE"
    }
    # `gpu-operator run` fills in only what its environment does not set; "" means no fallback
    assert missing_images({}) == CHART_DEFAULT_IMAGES
    assert missing_images(env) == {"CUDA_VALIDATOR_IMAGE": CHART_DEFAULT_IMAGES["CUDA_VALIDATOR_IMAGE"]}
    mine = missing_images({"DRIVER_IMAGE": "r.example/driver:1", "GFD_IMAGE": ""})
    assert "DRIVER_IMAGE" not in mine and "GFD_IMAGE" not in mine and "DCGM_IMAGE" in mine


def test_image_fallbacks_follow_the_image_rules(render: Callable[..., Rendered]) -> None:
    rendered = render(
        {
            "driver": {"version": "sha256:abc"},
            "vgpuManager": {"repository": "r.example", "version": "1"},
            "operator": {"version": "v9"},
        }
    )
    (container,) = find(rendered, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DRIVER_IMAGE"] == "nvcr.io/nvidia/driver@sha256:abc"
    assert env["VGPU_MANAGER_IMAGE"] == "r.example/vgpu-manager:1"
    assert container["image"] == "ghcr.io/gpu-operator-py/gpu-operator:v9"


def test_crd_hook_job(render: Callable[..., Rendered]) -> None:
    rendered = render()
    job = find(rendered, "Job", "gpu-operator-crds")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-operator-crds"
    # (nfd off); --release: a CRD another Helm release owns is left to it (kube/crdowners.py)
    assert pod["containers"][0]["command"] == [
        "gpu-operator",
        "crds",
        "apply",
        "--release",
        f"{NAMESPACE}/gpu-operator",
        "--no-node-feature",
    ]
    # The hook's identity exists before the Job runs (lower weight) and only touches our CRDs.
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        hooked = find(rendered, kind, "gpu-operator-crds")["metadata"]["annotations"]
        assert int(hooked["helm.sh/hook-weight"]) < 0
    rules = find(rendered, "ClusterRole", "gpu-operator-crds")["rules"]
    named = [r for r in rules if "resourceNames" in r]
    crd_files = sorted(p.name.split("_", 1)[1].removesuffix(".yaml") for p in (CHART / "crds").glob("*.yaml"))
    assert sorted(n.split(".")[0] for n in named[0]["resourceNames"]) == crd_files
    assert not any(
        o["kind"] == "Job" and o["metadata"]["name"] == "gpu-operator-crds"
        for o in objects(render({"operator": {"upgradeCRD": False}}))
    )


def test_a_crd_hook_job_helm_gave_up_on_is_replaced_by_the_next_run(render: Callable[..., Rendered]) -> None:
    """What `gpu-operator status` recommends after a pull failure works: the next install/upgrade
    replaces the Job left behind, the same Job may still finish when a Secret is fixed in place,
    and its pod names the release."""
    job = find(render(), "Job", "gpu-operator-crds")
    policy = job["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
    assert "before-hook-creation" in policy and "hook-failed" not in policy
    assert "activeDeadlineSeconds" not in job["spec"]
    assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "gpu-operator"


def test_cleanup_hook_job(render: Callable[..., Rendered]) -> None:
    rendered = render()
    job = find(rendered, "Job", "gpu-operator-cleanup")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-operator-cleanup"
    assert pod["containers"][0]["command"] == [
        "gpu-operator",
        "cleanup",
        "--operator-deployment=gpu-operator",
    ]
    assert find(rendered, "Deployment", "gpu-operator")  # the one it stops
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        hooked = find(rendered, kind, "gpu-operator-cleanup")["metadata"]["annotations"]
        assert hooked["helm.sh/hook"] == "pre-delete" and int(hooked["helm.sh/hook-weight"]) < 0
    # Only what the cleanup does: delete our CRs, patch node labels, taints and GPU health's
    # condition; nothing else.
    assert find(rendered, "ClusterRole", "gpu-operator-cleanup")["rules"] == [
        {
            "apiGroups": ["nvidia.com"],
            "resources": sorted(row.plural for row in CUSTOM_RESOURCES),  # the chart's crds/, by name
            "verbs": ["list", "delete"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["list", "delete"]},
    ]
    # In its namespace: stop the operator Deployment, see its pods go, delete an unrenewed Lease
    # and GPU health's requests Secret (the operator made it, so Helm would leave it).
    assert find(rendered, "Role", "gpu-operator-cleanup")["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments"],
            "resourceNames": ["gpu-operator"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [LEASE_NAME],
            "verbs": ["get", "delete"],
        },
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [HEALTH_REQUESTS_SECRET],
            "verbs": ["delete"],
        },
    ]
    assert not any(
        o["metadata"]["name"] == "gpu-operator-cleanup"
        for o in objects(render({"operator": {"cleanupOnUninstall": False}}))
    )


def test_clusterpolicy_can_be_left_out(render: Callable[..., Rendered]) -> None:
    assert not any(
        o["kind"] == "ClusterPolicy" for o in objects(render({"clusterPolicy": {"deployCR": False}}))
    )


def test_config_maps_rendered_on_request(render: Callable[..., Rendered]) -> None:
    rendered = render(
        {
            "devicePlugin": {
                "config": {
                    "create": True,
                    "name": "dp-config",
                    "default": "a",
                    "data": {"a": "version: v1\n", "b": {"version": "v1"}},
                }
            },
            "dcgmExporter": {
                "config": {"create": True, "name": "metrics", "data": "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"}
            },
        }
    )
    assert find(rendered, "ConfigMap", "dp-config")["data"] == {"a": "version: v1\n", "b": "version: v1"}
    assert find(rendered, "ConfigMap", "metrics")["data"] == {
        "dcgm-metrics.csv": "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
    }
    spec = find(rendered, "ClusterPolicy", "cluster-policy")["spec"]
    assert spec["devicePlugin"]["config"] == {"name": "dp-config", "default": "a"}
    assert spec["dcgmExporter"]["config"] == {"name": "metrics"}


def test_extra_objects(render: Callable[..., Rendered]) -> None:
    extra = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra-{{ .Release.Name }}"}},
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: extra-secret\n",
    ]
    rendered = render({"extraObjects": extra})
    assert find(rendered, "ConfigMap", "extra-gpu-operator")
    assert find(rendered, "Secret", "extra-secret")


@pytest.mark.parametrize("nfd", [True, False])
def test_gfd_labels_have_one_writer(render: Callable[..., Rendered], nfd: bool) -> None:
    """Our discovery instead of NFD: the operator mirrors GFD's NodeFeature labels and the CRD hook
    creates the NodeFeature CRD where absent (and may read it); with NFD, neither."""
    out = render({"nfd": {"enabled": nfd}})
    args = find(out, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--no-gfd-node-labels" in args) is (not nfd)
    job = find(out, "Job", "gpu-operator-crds")["spec"]["template"]["spec"]["containers"][0]
    assert job["command"][-1] == ("--node-feature" if nfd else "--no-node-feature")
    names = [r.get("resourceNames") or [] for r in find(out, "ClusterRole", "gpu-operator-crds")["rules"]]
    assert ("nodefeatures.nfd.k8s-sigs.io" in sum(names, [])) is nfd
