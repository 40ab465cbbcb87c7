"""Generated CRDs: committed files are current, schemas are structural, rules are present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator.api import crdgen

REPO = Path(__file__).resolve().parents[3]


def test_committed_crds_are_current() -> None:
    stale = crdgen.stale([crdgen.package_dir(), crdgen.chart_dir(REPO)])
    assert stale == [], f"stale CRDs {stale}: run `gpu-operator crds generate`"


def _walk(node: Any, path: str, problems: list[str]) -> None:
    if isinstance(node, dict):
        if "$ref" in node or "anyOf" in node or "$defs" in node:
            problems.append(f"{path}: not structural")
        is_schema = (
            "type" in node
            or "x-kubernetes-int-or-string" in node
            or "x-kubernetes-preserve-unknown-fields" in node
        )
        if "properties" in node and not is_schema:
            problems.append(f"{path}: object without type")
        for key, value in node.items():
            if key == "properties":
                for name, sub in value.items():
                    if not isinstance(sub, dict) or not (
                        "type" in sub
                        or "x-kubernetes-int-or-string" in sub
                        or "x-kubernetes-preserve-unknown-fields" in sub
                    ):
                        problems.append(f"{path}.{name}: no type")
                    _walk(sub, f"{path}.{name}", problems)
            elif key != "x-kubernetes-validations":
                _walk(value, f"{path}.{key}", problems)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            _walk(item, f"{path}[{index}]", problems)


def _schema(name: str) -> dict[str, Any]:
    crd = crdgen.crds()[name]
    version = crd["spec"]["versions"][0]
    return version["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def test_schemas_are_structural() -> None:
    assert len(crdgen.crds()) >= 2
    for name in crdgen.crds():
        problems: list[str] = []
        _walk(_schema(name), name, problems)
        assert problems == []


def test_clusterpolicy_schema_details() -> None:
    crd = crdgen.crds()["nvidia.com_clusterpolicies.yaml"]
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["scope"] == "Cluster"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Status", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["operator"]["properties"]["runtimeClass"]["default"] == "nvidia"
    assert props["mig"]["properties"]["strategy"]["enum"] == ["none", "single", "mixed"]
    assert props["sandboxWorkloads"]["properties"]["defaultWorkload"]["default"] == "container"
    upgrade = props["driver"]["properties"]["upgradePolicy"]["properties"]
    assert upgrade["maxUnavailable"] == {"x-kubernetes-int-or-string": True, "default": "25%"}
    resources = props["driver"]["properties"]["resources"]["properties"]["limits"]
    assert resources["additionalProperties"] == {"x-kubernetes-int-or-string": True}
    # Kubernetes types typed as upstream's CRD has them (core/v1 Toleration, PodSecurityContext,
    # the monitoring API's RelabelConfig), so a wrong type is refused by the apiserver
    toleration = props["daemonsets"]["properties"]["tolerations"]["items"]
    assert (
        toleration["type"] == "object" and toleration["properties"]["tolerationSeconds"]["type"] == "integer"
    )
    context = props["daemonsets"]["properties"]["podSecurityContext"]["properties"]
    assert context["runAsUser"]["type"] == "integer" and context["seccompProfile"]["required"] == ["type"]
    monitor = props["dcgmExporter"]["properties"]["serviceMonitor"]["properties"]
    assert monitor["interval"]["pattern"].startswith("^(0|")
    assert "keepequal" in monitor["relabelings"]["items"]["properties"]["action"]["enum"]
    rules = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert any("nriPluginEnabled" in m for m in rules)
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["state"]["enum"] == ["ignored", "ready", "notReady"]


def test_nvidiadriver_schema_details() -> None:
    crd = crdgen.crds()["nvidia.com_nvidiadrivers.yaml"]
    assert crd["spec"]["names"]["shortNames"] == ["nvd", "nvdriver", "nvdrivers"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["driverType"]["enum"] == ["gpu", "vgpu", "vgpu-host-manager"]
    messages = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert "driverType is immutable" in messages


def test_packaged_crds_load() -> None:
    assert [c["metadata"]["name"] for c in crdgen.load_packaged()] == [
        "clusterpolicies.nvidia.com",
        "gpuclusters.nvidia.com",
        "nvidiadrivers.nvidia.com",
        "computedomaincliques.resource.nvidia.com",
        "computedomains.resource.nvidia.com",
    ]  # file order


def test_gpucluster_schema_details() -> None:
    """Upstream's v26.7.0 GPUCluster CRD: singleton by a CEL rule on the object, draDriver required,
    the image pattern, defaults, the healthcheck port range, a required status state."""
    crd = crdgen.crds()["nvidia.com_gpuclusters.yaml"]
    assert crd["spec"]["names"]["shortNames"] == ["gc"] and crd["spec"]["scope"] == "Cluster"
    version = crd["spec"]["versions"][0]
    assert (version["name"], version["subresources"]) == ("v1alpha1", {"status": {}})
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Status", "Age"]
    root = version["schema"]["openAPIV3Schema"]
    assert root["x-kubernetes-validations"] == [
        {
            "rule": "self.metadata.name == 'gpu-cluster'",
            "message": "GPUCluster is a singleton, metadata.name must be 'gpu-cluster'",
        }
    ]
    spec, status = root["properties"]["spec"], root["properties"]["status"]
    assert spec["required"] == ["draDriver"] and status["required"] == ["state"]
    assert status["properties"]["state"]["enum"] == ["ready", "notReady", "disabled"]
    dra = spec["properties"]["draDriver"]["properties"]
    assert dra["image"]["pattern"] == r"^[a-zA-Z0-9\-]+$"
    assert dra["featureGates"]["additionalProperties"] == {"type": "boolean"}
    cd = dra["computeDomains"]["properties"]
    assert cd["enabled"]["default"] is True
    check = cd["kubeletPlugin"]["properties"]["healthcheck"]["properties"]
    assert check["enabled"]["default"] is True and (check["port"]["minimum"], check["port"]["maximum"]) == (
        1,
        65535,
    )
    assert spec["properties"]["hostPaths"]["properties"]["kubeletRootDir"]["default"] == "/var/lib/kubelet"
    assert "rootFS" not in spec["properties"]["hostPaths"]["properties"]
