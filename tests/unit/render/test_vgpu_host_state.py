"""The sandbox validator's vgpu-host-state init container: where it runs in the pod, what it reads
(the vGPU device manager's ConfigMap, the policy's Fabric Manager mode), and when it is left out."""

from __future__ import annotations

from typing import Any

from tests.unit.render.renderkit import daemonset, run

VGPU = {
    "sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-vgpu"},
    "vgpuManager": {"enabled": True},
    "vgpuDeviceManager": {"enabled": True},
}


def pod(spec: dict[str, Any]) -> dict[str, Any]:
    ds = daemonset(run(spec, "dgx-h100:1"), "state-sandbox-validation")
    return ds["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def env(ctr: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in ctr.get("env", [])}


def test_it_runs_after_the_vfio_check_and_before_the_vgpu_manager_check() -> None:
    names = [c["name"] for c in pod(VGPU)["initContainers"]]
    assert names[names.index("vgpu-host-state") + 1] == "vgpu-manager-validation"
    assert names.index("vfio-pci-validation") < names.index("vgpu-host-state")


def test_it_reads_the_device_managers_configmap_and_the_policys_fabric_mode() -> None:
    spec = {
        **VGPU,
        "vgpuDeviceManager": {"enabled": True, "config": {"name": "my-vgpu", "default": "H100XM-20C"}},
        "vgpuManager": {"enabled": True, "env": [{"name": "NVFM_CONFIG_FABRIC_MODE", "value": "1"}]},
    }
    p = pod(spec)
    ctr = next(c for c in p["initContainers"] if c["name"] == "vgpu-host-state")
    assert ctr["command"] == ["gpu-operator", "node", "vgpu-host-state"]
    assert (
        ctr["image"]
        == next(c for c in p["initContainers"] if c["name"] == "vgpu-manager-validation")["image"]
    )
    assert env(ctr)["DEFAULT_VGPU_CONFIG"] == "H100XM-20C" and env(ctr)["FABRIC_MODE"] == "1"
    assert env(ctr)["DEFAULT_GPU_WORKLOAD_CONFIG"] == "vm-vgpu"
    volume = next(v for v in p["volumes"] if v["name"] == "vgpu-host-state-config")
    assert volume["configMap"] == {"name": "my-vgpu", "optional": True}


def test_the_default_fabric_mode_is_vgpu_multitenancy() -> None:
    ctr = next(c for c in pod(VGPU)["initContainers"] if c["name"] == "vgpu-host-state")
    assert env(ctr)["FABRIC_MODE"] == "2"


def test_without_the_vgpu_device_manager_there_is_no_config_and_no_init_container() -> None:
    p = pod({**VGPU, "vgpuDeviceManager": {"enabled": False}})
    assert "vgpu-host-state" not in [c["name"] for c in p["initContainers"]]
    assert "vgpu-host-state-config" not in [v["name"] for v in p["volumes"]]
