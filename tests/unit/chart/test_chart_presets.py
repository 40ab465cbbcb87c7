"""Each preset renders the ClusterPolicy that a user of that host shape expects, and nothing else changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support.chart import VGPU_IMAGE, Rendered, Values, deep_merge, find, preset

# When upstream's operator runs a state (upstream-contract section 2.2), from the ClusterPolicy spec.
STATE_ENABLED: dict[str, Callable[[dict[str, Any]], bool]] = {
    "state-driver": lambda s: s["driver"]["enabled"] and not s["driver"]["useNvidiaDriverCRD"],
    "state-container-toolkit": lambda s: s["toolkit"]["enabled"],
    "state-device-plugin": lambda s: s["devicePlugin"]["enabled"],
    "state-dcgm-exporter": lambda s: s["dcgmExporter"]["enabled"],
    "gpu-feature-discovery": lambda s: s["gfd"]["enabled"],
    "state-mig-manager": lambda s: s["migManager"]["enabled"],
    "state-vgpu-manager": lambda s: _sandbox(s) and s["vgpuManager"]["enabled"],
    "state-vgpu-device-manager": lambda s: _sandbox(s) and s["vgpuDeviceManager"]["enabled"],
    "state-sandbox-validation": lambda s: _sandbox(s),
    "state-vfio-manager": lambda s: _sandbox(s) and s["vfioManager"]["enabled"],
    "state-sandbox-device-plugin": lambda s: (
        _sandbox(s) and s["sandboxDevicePlugin"]["enabled"] and s["sandboxWorkloads"]["mode"] == "kubevirt"
    ),
    "state-kata-device-plugin": lambda s: (
        _sandbox(s) and s["kataSandboxDevicePlugin"]["enabled"] and s["sandboxWorkloads"]["mode"] == "kata"
    ),
    "state-cc-manager": lambda s: (
        _sandbox(s) and s["ccManager"]["enabled"] and s["sandboxWorkloads"]["mode"] == "kata"
    ),
}


def _sandbox(spec: dict[str, Any]) -> bool:
    return bool(spec["sandboxWorkloads"]["enabled"])


def enabled_states(spec: dict[str, Any]) -> set[str]:
    return {state for state, rule in STATE_ENABLED.items() if rule(spec)}


def changed(base: Any, other: Any, path: str = "") -> dict[str, Any]:
    """{path: new value} for every leaf where `other` differs from `base`."""
    if isinstance(other, dict) and isinstance(base, dict | None):
        base = base or {}
        found: dict[str, Any] = {}
        for key in sorted(set(base) | set(other)):
            found |= changed(base.get(key), other.get(key), f"{path}.{key}" if path else key)
        return found
    return {} if base == other else {path: other}


def policy(render: Callable[..., Rendered], values: Values) -> dict[str, Any]:
    spec: dict[str, Any] = find(render(values), "ClusterPolicy", "cluster-policy")["spec"]
    return spec


def test_defaults_run_the_container_stack_with_a_driver(render: Callable[..., Rendered]) -> None:
    spec = policy(render, {})
    assert enabled_states(spec) == {
        "state-driver",
        "state-container-toolkit",
        "state-device-plugin",
        "state-dcgm-exporter",
        "gpu-feature-discovery",
        "state-mig-manager",
    }
    assert spec["sandboxWorkloads"] == {"enabled": False, "defaultWorkload": "container", "mode": "kubevirt"}
    assert spec["driver"]["upgradePolicy"]["autoUpgrade"] is True
    assert spec["mig"] == {"strategy": "single"}
    assert spec["cdi"] == {"enabled": True, "nriPluginEnabled": False}


def test_container_preset_uses_the_host_driver(render: Callable[..., Rendered]) -> None:
    default, spec = policy(render, {}), policy(render, preset("container"))
    assert changed(default, spec) == {"driver.enabled": False, "vfioManager.enabled": False}
    assert enabled_states(spec) == {
        "state-container-toolkit",
        "state-device-plugin",
        "state-dcgm-exporter",
        "gpu-feature-discovery",
        "state-mig-manager",
    }
    assert spec["devicePlugin"]["enabled"] is True
    assert spec["sandboxWorkloads"]["enabled"] is False


def test_passthrough_preset_binds_gpus_to_vfio_for_kubevirt(render: Callable[..., Rendered]) -> None:
    default, spec = policy(render, {}), policy(render, preset("passthrough"))
    assert changed(default, spec) == {
        "sandboxWorkloads.enabled": True,
        "sandboxWorkloads.defaultWorkload": "vm-passthrough",
        "driver.enabled": False,
        "devicePlugin.enabled": False,
        "ccManager.enabled": False,
        "vgpuDeviceManager.enabled": False,
    }
    # The container operands stay enabled, but deploy labels keep them off vm-passthrough nodes.
    assert {
        "state-vfio-manager",
        "state-sandbox-device-plugin",
        "state-sandbox-validation",
    } <= enabled_states(spec)
    assert not {
        "state-driver",
        "state-device-plugin",
        "state-vgpu-manager",
        "state-vgpu-device-manager",
        "state-cc-manager",
        "state-kata-device-plugin",
    } & enabled_states(spec)
    assert spec["vfioManager"]["enabled"] is True
    assert spec["sandboxDevicePlugin"]["enabled"] is True


def test_vgpu_preset_runs_the_vgpu_manager(render: Callable[..., Rendered]) -> None:
    default, spec = policy(render, {}), policy(render, deep_merge(preset("vgpu"), VGPU_IMAGE))
    assert changed(default, spec) == {
        "sandboxWorkloads.enabled": True,
        "sandboxWorkloads.defaultWorkload": "vm-vgpu",
        "driver.enabled": False,
        "devicePlugin.enabled": False,
        "vgpuManager.enabled": True,
        "vgpuManager.repository": "registry.example.com/nvidia",
        "vgpuManager.version": "17.4",
        "ccManager.enabled": False,
    }
    assert {
        "state-vgpu-manager",
        "state-vgpu-device-manager",
        "state-sandbox-device-plugin",
        "state-sandbox-validation",
    } <= enabled_states(spec)
    assert not {"state-driver", "state-device-plugin", "state-cc-manager"} & enabled_states(spec)


def test_vgpu_preset_alone_asks_for_the_vgpu_manager_image(render: Callable[..., Rendered]) -> None:
    from helm_python import HelmRenderError

    with pytest.raises(HelmRenderError, match=r"vgpuManager\.repository and vgpuManager\.version"):
        render(preset("vgpu"))


@pytest.mark.parametrize("name", ["container", "passthrough", "vgpu"])
def test_presets_are_small(name: str) -> None:
    # A preset says what differs from the defaults, nothing more.
    flat = changed({}, preset(name))
    assert 4 <= len(flat) <= 10, flat
