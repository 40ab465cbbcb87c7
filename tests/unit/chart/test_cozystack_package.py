"""The platform package (deployments/cozystack): the wrapper chart rendered through Helm's own engine
(helm-python-sdk) with our chart as its dependency, once per variant of the package source, and the
ClusterPolicy each variant produces."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml

from tests.support.chart import CHART, VGPU_IMAGE, deep_merge, find, objects

PACKAGE = CHART.parent / "cozystack"
WRAPPER = PACKAGE / "packages" / "system" / "gpu-operator"
SOURCE = PACKAGE / "packages" / "core" / "platform" / "sources" / "gpu-operator.yaml"


@pytest.fixture(scope="module")
def wrapper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[helm_python.Chart]:
    """The wrapper chart with its dependency in charts/, as `helm dependency build` leaves it
    (the file:// repository in Chart.yaml must point at our chart)."""
    meta = yaml.safe_load((WRAPPER / "Chart.yaml").read_text())
    (dep,) = meta["dependencies"]
    assert (WRAPPER / dep["repository"].removeprefix("file://")).resolve() == CHART.resolve()
    assert dep["version"] == yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    root = tmp_path_factory.mktemp("cozystack") / "gpu-operator"
    shutil.copytree(WRAPPER, root, ignore=shutil.ignore_patterns("charts"))
    shutil.copytree(CHART, root / "charts" / dep["name"], ignore=shutil.ignore_patterns("charts"))
    with helm_python.Chart.load(root) as loaded:
        yield loaded


def variants() -> dict[str, list[str]]:
    source = yaml.safe_load(SOURCE.read_text())
    assert source["kind"] == "PackageSource" and source["metadata"]["name"] == "cozystack.gpu-operator"
    out = {}
    for variant in source["spec"]["variants"]:
        (component,) = variant["components"]
        assert component["path"] == "system/gpu-operator"
        assert component["install"] == {
            "privileged": True,
            "namespace": "cozy-gpu-operator",
            "releaseName": "gpu-operator",
        }
        out[variant["name"]] = component["valuesFiles"]
    return out


def policy(chart: helm_python.Chart, variant: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    values: dict[str, Any] = {"gpu-operator": {"nfd": {"enabled": False}}}  # NFD's chart is fetched online
    for name in variants()[variant]:
        values = deep_merge(values, yaml.safe_load((WRAPPER / name).read_text()))
    values = deep_merge(values, extra or {})
    rendered = chart.render(values, name="gpu-operator", namespace="cozy-gpu-operator", is_install=True)
    spec: dict[str, Any] = find(objects(rendered), "ClusterPolicy", "cluster-policy")["spec"]
    return spec


def test_the_source_lists_the_host_variants_and_the_guest_on_the_common_values() -> None:
    found = variants()
    assert found == {
        "default": ["values.yaml", "values-passthrough.yaml"],
        "vgpu": ["values.yaml", "values-vgpu.yaml"],
        "container": ["values.yaml", "values-container.yaml"],
        "guest": ["values.yaml", "values-guest.yaml"],
    }
    for files in found.values():
        for name in files:
            assert set(yaml.safe_load((WRAPPER / name).read_text())) == {"gpu-operator"}, name


def test_default_is_vfio_passthrough_for_kubevirt(wrapper: helm_python.Chart) -> None:
    spec = policy(wrapper, "default")
    assert spec["sandboxWorkloads"] == {
        "enabled": True,
        "defaultWorkload": "vm-passthrough",
        "mode": "kubevirt",
    }
    assert spec["driver"]["enabled"] is False and spec["devicePlugin"]["enabled"] is False
    assert spec["vfioManager"]["enabled"] is True
    # KubeVirt's own plugin advertises the GPUs (seed 001's names); the operator keeps the list
    assert spec["sandboxDevicePlugin"]["enabled"] is False
    assert spec["sandboxWorkloads"].get("kubevirt", {}).get("syncPermittedHostDevices", True) is True
    assert spec["ccManager"]["enabled"] is False and spec["vgpuDeviceManager"]["enabled"] is False


def test_vgpu(wrapper: helm_python.Chart) -> None:
    spec = policy(wrapper, "vgpu", {"gpu-operator": VGPU_IMAGE})
    assert (
        spec["sandboxWorkloads"]["defaultWorkload"] == "vm-vgpu"
        and spec["sandboxWorkloads"]["enabled"] is True
    )
    assert (
        spec["vgpuManager"]["enabled"] is True
        and spec["vgpuManager"]["repository"] == "registry.example.com/nvidia"
    )
    assert spec["vgpuDeviceManager"]["enabled"] is True and spec["sandboxDevicePlugin"]["enabled"] is True
    assert spec["driver"]["enabled"] is False and spec["ccManager"]["enabled"] is False


def test_container_is_seed_000s_settings(wrapper: helm_python.Chart) -> None:
    spec = policy(wrapper, "container")
    assert spec["sandboxWorkloads"]["enabled"] is False
    assert spec["driver"]["enabled"] is False and spec["devicePlugin"]["enabled"] is True
    assert spec["vfioManager"]["enabled"] is False
    assert spec["toolkit"]["enabled"] is True  # configures containerd to inject the GPUs


def test_sync_can_be_turned_off_from_the_package_values(wrapper: helm_python.Chart) -> None:
    spec = policy(
        wrapper,
        "default",
        {"gpu-operator": {"sandboxWorkloads": {"kubevirt": {"syncPermittedHostDevices": False}}}},
    )
    assert spec["sandboxWorkloads"]["kubevirt"] == {"syncPermittedHostDevices": False}


def test_guest_runs_the_container_stack_with_the_operators_driver(wrapper: helm_python.Chart) -> None:
    """Inside a VM with GPUs passed through: the driver container, toolkit and device plugin, as on
    bare metal; nothing of the host's VM stack."""
    spec = policy(wrapper, "guest")
    assert spec["sandboxWorkloads"]["enabled"] is False
    assert spec["driver"]["enabled"] is True and spec["toolkit"]["enabled"] is True
    assert spec["devicePlugin"]["enabled"] is True
    assert spec["vfioManager"]["enabled"] is False and spec["sandboxDevicePlugin"]["enabled"] is False
    assert spec["ccManager"]["enabled"] is False and spec["vgpuDeviceManager"]["enabled"] is False
