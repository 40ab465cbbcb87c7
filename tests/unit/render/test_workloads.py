"""The three workload configurations and the container variant of seed 000 (host driver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.render import render
from gpu_operator.render.clitext import load_policy
from tests.unit.render.renderkit import daemonset, facts

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def enabled(example: str, *nodes: str) -> set[str]:
    result = render(load_policy(EXAMPLES / example), facts(*nodes))
    return {s.name for s in result.states if s.enabled}


def test_default_example_is_minimal() -> None:
    assert (EXAMPLES / "clusterpolicy-default.yaml").read_text().count("spec: {}") == 1


def test_container_workload_default() -> None:
    states = enabled("clusterpolicy-default.yaml", "dgx-h100:2")
    assert {
        "state-driver",
        "state-container-toolkit",
        "state-device-plugin",
        "gpu-feature-discovery",
        "state-dcgm-exporter",
        "state-mig-manager",
        "state-operator-validation",
    } <= states
    assert not {s for s in states if "vfio" in s or "sandbox" in s or "vgpu" in s}


def test_seed_000_host_driver_container_variant() -> None:
    result = render(
        load_policy(EXAMPLES / "clusterpolicy-container-host-driver.yaml"), facts("host-driver:2")
    )
    by_name = {s.name: s for s in result.states}
    assert not by_name["state-driver"].enabled  # the host driver stays in charge
    assert by_name["state-driver"].objects == []
    assert by_name["state-device-plugin"].enabled  # nvidia.com/gpu is published
    assert by_name["state-container-toolkit"].enabled
    assert not by_name["state-vfio-manager"].enabled  # the host driver is never unbound
    assert not by_name["state-sandbox-validation"].enabled
    plugin = daemonset(result, "state-device-plugin")
    assert plugin["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_vm_passthrough() -> None:
    states = enabled("clusterpolicy-vm-passthrough.yaml", "vfio-passthrough:2")
    assert {"state-vfio-manager", "state-sandbox-device-plugin", "state-sandbox-validation"} <= states
    assert "state-vgpu-manager" not in states and "state-kata-device-plugin" not in states
    # the container stack still exists for nodes whose workload config is container (node labels decide)
    assert "state-device-plugin" in states


def test_vm_vgpu() -> None:
    states = enabled("clusterpolicy-vm-vgpu.yaml", "dgx-h100:1")
    assert {
        "state-vgpu-manager",
        "state-vgpu-device-manager",
        "state-sandbox-device-plugin",
        "state-sandbox-validation",
    } <= states
    result = render(load_policy(EXAMPLES / "clusterpolicy-vm-vgpu.yaml"), facts("dgx-h100:1"))
    manager = daemonset(result, "state-vgpu-manager")
    image = manager["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/nvidia/vgpu-manager:595.91.07-ubuntu22.04"


@pytest.mark.parametrize(
    ("workload", "label"), [("vm-passthrough", "vfio-manager"), ("vm-vgpu", "vgpu-device-manager")]
)
def test_sandbox_daemonsets_are_gated_by_deploy_labels(workload: str, label: str) -> None:
    example = f"clusterpolicy-{workload}.yaml"
    result = render(load_policy(EXAMPLES / example), facts("dgx-h100:1"))
    states = [s for s in result.states if s.enabled and any(o["kind"] == "DaemonSet" for o in s.objects)]
    selectors = [
        o["spec"]["template"]["spec"]["nodeSelector"]
        for s in states
        for o in s.objects
        if o["kind"] == "DaemonSet"
    ]
    assert {f"nvidia.com/gpu.deploy.{label}": "true"} in selectors


def test_sandbox_validator_knows_the_default_workload() -> None:
    result = render(load_policy(EXAMPLES / "clusterpolicy-vm-passthrough.yaml"), facts("vfio-passthrough:1"))
    ds = daemonset(result, "state-sandbox-validation")
    inits = {c["name"]: c for c in ds["spec"]["template"]["spec"]["initContainers"]}
    assert "cc-manager-validation" not in inits  # ccManager is off
    env = {e["name"]: e.get("value") for e in inits["vfio-pci-validation"]["env"]}
    assert env["DEFAULT_GPU_WORKLOAD_CONFIG"] == "vm-passthrough"


def test_default_mig_layouts_cover_current_gpus_and_the_balanced_layout() -> None:
    import yaml

    from gpu_operator.render.states.mig_manager import GPU_CLIENT_SERVICES, default_mig_config

    configs = yaml.safe_load(default_mig_config())["mig-configs"]
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb", "all-7g.80gb"} <= set(configs)
    # H100 NVL (94 GB), H200 (141 GB), B200 (180 GB) sizes
    assert {"all-7g.94gb", "all-7g.141gb", "all-7g.180gb"} <= set(configs)
    balanced = {f for entry in configs["all-balanced"] for f in entry["device-filter"]}
    assert {"0x233510DE", "0x233010DE"} <= balanced  # H200, H100 SXM
    assert all(e["devices"] == "all" for layouts in configs.values() for e in layouts)
    assert len(GPU_CLIENT_SERVICES) == 9 and "nvidia-dcgm.service" in GPU_CLIENT_SERVICES


def test_mig_manager_sources_driver_ready_and_mounts_the_driver_root() -> None:
    from tests.unit.render.renderkit import ctr, daemonset, env_of, run

    result = run()
    ds = daemonset(result, "state-mig-manager")
    main = ctr(ds, "nvidia-mig-manager")
    assert "WITH_SHUTDOWN_HOST_GPU_CLIENTS" not in env_of(main)
    assert any(m["mountPath"] == "/driver-root" for m in main["volumeMounts"])
    script = next(
        o
        for o in result.state("state-mig-manager").objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "nvidia-mig-manager-entrypoint"
    )
    text = script["data"]["entrypoint.sh"]
    assert "driver-ready" in text and 'WITH_SHUTDOWN_HOST_GPU_CLIENTS="$IS_HOST_DRIVER"' in text


def test_config_manager_init_sends_no_signal_and_knows_its_node() -> None:
    from tests.unit.render.renderkit import ctr, daemonset, env_of, run

    result = run({"devicePlugin": {"config": {"name": "time-slicing", "default": "any"}}})
    for state, process in (
        ("state-device-plugin", "nvidia-device-plugin"),
        ("gpu-feature-discovery", "gpu-feature-discovery"),
        ("state-mps-control-daemon", "/usr/bin/mps-control-daemon"),
    ):
        ds = daemonset(result, state)
        init, sidecar = ctr(ds, "config-manager-init"), ctr(ds, "config-manager")
        assert env_of(init)["SEND_SIGNAL"] == "false" and "NODE_NAME" in env_of(init)
        assert env_of(sidecar)["SEND_SIGNAL"] == "true" and env_of(sidecar)["PROCESS_TO_SIGNAL"] == process
