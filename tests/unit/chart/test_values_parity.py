"""Every key of NVIDIA's v26.7.0 values.yaml is a key of ours (a recorded list of its key paths),
and the keys added for parity do what they do there: per-operand hostNetwork reaches the policy
and the operand's pod, operator.env the operator's container, dcgmExporter.annotations the
exporter's pods. The keys NVIDIA's main added since (a second recorded list) are ours too:
operator.securityContext (pod level, merged key by key as Helm merges values), operator.dnsPolicy
and operator.dnsConfig reach the operator's pod."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, Rendered, find, objects
from tests.unit.render import renderkit

UPSTREAM_KEYS = Path(__file__).parent / "data" / "upstream-values-keys.txt"
UPSTREAM_MAIN_KEYS = Path(__file__).parent / "data" / "upstream-main-values-keys.txt"
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
SANDBOX = (
    "vfioManager",
    "sandboxDevicePlugin",
    "vgpuManager",
    "vgpuDeviceManager",
    "ccManager",
    "kataSandboxDevicePlugin",
    "kataManager",
)


def _paths(values: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(values, dict):
        for key, value in values.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out |= {path} | _paths(value, path)
    return out


def _recorded(path: Path) -> set[str]:
    return {line for line in path.read_text().splitlines() if line and not line.startswith("#")}


def test_every_upstream_values_key_is_one_of_ours() -> None:
    upstream = _recorded(UPSTREAM_KEYS) | _recorded(UPSTREAM_MAIN_KEYS)
    assert len(upstream) > 300  # the recorded list is whole
    assert {"operator.securityContext", "operator.dnsPolicy", "operator.dnsConfig"} <= upstream
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
    spec = find(render({key: {"hostNetwork": True, "enabled": True}}), "ClusterPolicy", "cluster-policy")[
        "spec"
    ]
    state, name = OPERANDS[key]
    pod = renderkit.daemonset(renderkit.run(spec), state, name)["spec"]["template"]["spec"]
    assert (pod.get("hostNetwork"), pod.get("dnsPolicy")) == (True, "ClusterFirstWithHostNet")
    plain = renderkit.daemonset(
        renderkit.run({key: {"enabled": True}} if key != "validator" else {}), state, name
    )
    assert "hostNetwork" not in plain["spec"]["template"]["spec"]


def test_operator_env_is_added_to_the_operator_container(render: Callable[..., Rendered]) -> None:
    extra = [
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
        {"name": "NO_PROXY", "value": ".svc,10.0.0.1"},
    ]
    deployment = find(render({"operator": {"env": extra}}), "Deployment", "gpu-operator")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[-2:] == extra and env[0]["name"] == "OPERATOR_NAMESPACE"


def test_dcgm_exporter_annotations_reach_its_pods(render: Callable[..., Rendered]) -> None:
    notes = {"prometheus.io/scrape": "true"}
    spec = find(render({"dcgmExporter": {"annotations": notes}}), "ClusterPolicy", "cluster-policy")["spec"]
    assert spec["dcgmExporter"]["annotations"] == notes
    ds = renderkit.daemonset(renderkit.run(spec), "state-dcgm-exporter", "nvidia-dcgm-exporter")
    assert ds["spec"]["template"]["metadata"]["annotations"].items() >= notes.items()


def _operator_pod(rendered: Rendered) -> dict[str, Any]:
    pod: dict[str, Any] = find(rendered, "Deployment", "gpu-operator")["spec"]["template"]["spec"]
    return pod


RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def unsupported_keys(rendered: Rendered) -> list[str]:
    """The keys the chart's values report (ConfigMap gpu-operator-values-report) calls ignored."""
    report = yaml.safe_load(
        find(rendered, "ConfigMap", "gpu-operator-values-report")["data"]["unsupported.yaml"]
    )
    return [entry["key"] for entry in report or []]


def _hook_pods(rendered: Rendered) -> list[dict[str, Any]]:
    """The hook Jobs that run the operator's image (CRD apply before install, cleanup before delete)."""
    jobs = [o for o in objects(rendered) if o["kind"] == "Job"]
    assert len(jobs) >= 2, [j["metadata"]["name"] for j in jobs]
    return [j["spec"]["template"]["spec"] for j in jobs]


def test_operator_security_context_defaults_to_restricted(render: Callable[..., Rendered]) -> None:
    rendered = render()
    pod = _operator_pod(rendered)
    assert pod["securityContext"] == RESTRICTED_POD
    assert pod["containers"][0]["securityContext"] == RESTRICTED_CONTAINER
    assert [p["securityContext"] for p in _hook_pods(rendered)] == [RESTRICTED_POD] * len(
        _hook_pods(rendered)
    )


def test_operator_security_context_is_merged_key_by_key(render: Callable[..., Rendered]) -> None:
    # a values file's map merges into the default (Helm's values merge); null removes a key
    rendered = render(
        {
            "operator": {
                "securityContext": {
                    "runAsUser": 1000,
                    "runAsGroup": 1000,
                    "fsGroup": 2000,
                    "seccompProfile": None,
                }
            }
        }
    )
    want = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000}
    assert _operator_pod(rendered)["securityContext"] == want
    assert [p["securityContext"] for p in _hook_pods(rendered)] == [want] * len(_hook_pods(rendered))
    # the container's own context is fixed, as in NVIDIA's chart
    assert _operator_pod(rendered)["containers"][0]["securityContext"] == RESTRICTED_CONTAINER
    assert "operator.securityContext" not in unsupported_keys(rendered)


def test_operator_security_context_null_leaves_it_out(render: Callable[..., Rendered]) -> None:
    rendered = render({"operator": {"securityContext": None}})
    assert "securityContext" not in _operator_pod(rendered)
    assert [p for p in _hook_pods(rendered) if "securityContext" in p] == []


def test_operator_dns_policy_reaches_the_pod_only_when_set(render: Callable[..., Rendered]) -> None:
    assert "dnsPolicy" not in _operator_pod(render())  # "": the cluster's default (ClusterFirst)
    rendered = render({"operator": {"dnsPolicy": "None"}})
    assert _operator_pod(rendered)["dnsPolicy"] == "None"
    assert "operator.dnsPolicy" not in unsupported_keys(rendered)


def test_operator_dns_config_reaches_the_pod_only_when_set(render: Callable[..., Rendered]) -> None:
    assert "dnsConfig" not in _operator_pod(render())
    dns = {
        "nameservers": ["10.0.0.53"],
        "searches": ["corp.example.com"],
        "options": [{"name": "ndots", "value": "2"}],
    }
    rendered = render({"operator": {"dnsConfig": dns}})
    assert _operator_pod(rendered)["dnsConfig"] == dns
    assert "operator.dnsConfig" not in unsupported_keys(rendered)
