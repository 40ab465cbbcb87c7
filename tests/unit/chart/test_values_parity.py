"""Every key of NVIDIA's v26.7.0 values.yaml is a key of ours (a recorded list of its key paths),
and the keys added for parity do what they do there: per-operand hostNetwork reaches the policy
and the operand's pod, operator.env the operator's container, dcgmExporter.annotations the
exporter's pods."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, Rendered, find
from tests.unit.render import renderkit

UPSTREAM_KEYS = Path(__file__).parent / "data" / "upstream-values-keys.txt"
OPERANDS = {  # values key -> (state, DaemonSet) the flag reaches
    "driver": ("state-driver", "nvidia-driver-daemonset"),
    "toolkit": ("state-container-toolkit", "nvidia-container-toolkit-daemonset"),
    "devicePlugin": ("state-device-plugin", "nvidia-device-plugin-daemonset"),
    "dcgm": ("state-dcgm", "nvidia-dcgm"),
    "gfd": ("gpu-feature-discovery", "gpu-feature-discovery"),
    "migManager": ("state-mig-manager", "nvidia-mig-manager"),
    "validator": ("state-operator-validation", "nvidia-operator-validator"),
    "nodeStatusExporter": ("state-node-status-exporter", "nvidia-node-status-exporter"),
}
SANDBOX = ("vfioManager", "sandboxDevicePlugin", "vgpuManager", "vgpuDeviceManager", "ccManager",
           "kataSandboxDevicePlugin", "kataManager")


def _paths(values: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(values, dict):
        for key, value in values.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out |= {path} | _paths(value, path)
    return out


def test_every_upstream_values_key_is_one_of_ours() -> None:
    upstream = {line for line in UPSTREAM_KEYS.read_text().splitlines() if line and not line.startswith("#")}
    assert len(upstream) > 300  # the recorded list is whole
    ours = _paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    # NFD's subchart is not shipped (nfd.enabled runs our discovery): its values are reported as
    # ignored by the chart (test_chart_values.py), every other key is ours
    assert sorted(k for k in upstream - ours if k.split(".")[0] != "node-feature-discovery") == []


def test_host_network_is_left_out_by_default_and_passed_when_set(render: Callable[..., Rendered]) -> None:
    keys = (*OPERANDS, *SANDBOX)
    default = find(render(), "ClusterPolicy", "cluster-policy")["spec"]
    assert [k for k in keys if "hostNetwork" in (default.get(k) or {})] == []
    spec = find(render({k: {"hostNetwork": True} for k in keys}), "ClusterPolicy", "cluster-policy")["spec"]
    assert {k: spec[k].get("hostNetwork") for k in keys} == dict.fromkeys(keys, True)


@pytest.mark.parametrize("key", sorted(OPERANDS))
def test_host_network_reaches_the_operands_pod(render: Callable[..., Rendered], key: str) -> None:
    spec = find(render({key: {"hostNetwork": True, "enabled": True}}), "ClusterPolicy", "cluster-policy")["spec"]
    state, name = OPERANDS[key]
    pod = renderkit.daemonset(renderkit.run(spec), state, name)["spec"]["template"]["spec"]
    assert (pod.get("hostNetwork"), pod.get("dnsPolicy")) == (True, "ClusterFirstWithHostNet")
    plain = renderkit.daemonset(renderkit.run({key: {"enabled": True}} if key != "validator" else {}), state, name)
    assert "hostNetwork" not in plain["spec"]["template"]["spec"]


def test_operator_env_is_added_to_the_operator_container(render: Callable[..., Rendered]) -> None:
    extra = [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}, {"name": "NO_PROXY", "value": ".svc,10.0.0.1"}]
    deployment = find(render({"operator": {"env": extra}}), "Deployment", "gpu-operator")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[-2:] == extra and env[0]["name"] == "OPERATOR_NAMESPACE"


def test_dcgm_exporter_annotations_reach_its_pods(render: Callable[..., Rendered]) -> None:
    notes = {"prometheus.io/scrape": "true"}
    spec = find(render({"dcgmExporter": {"annotations": notes}}), "ClusterPolicy", "cluster-policy")["spec"]
    assert spec["dcgmExporter"]["annotations"] == notes
    ds = renderkit.daemonset(renderkit.run(spec), "state-dcgm-exporter", "nvidia-dcgm-exporter")
    assert ds["spec"]["template"]["metadata"]["annotations"].items() >= notes.items()
