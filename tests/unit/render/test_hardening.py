"""Least privilege on the operand pods (render/transforms/hardening.py): defaults only where the policy
and the state leave a field unset, privileged containers left as their runtime treats them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_operator.render import RenderResult, render
from gpu_operator.render.clitext import load_gpucluster, load_policy
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.dra import render_gpucluster
from gpu_operator.render.dra.common import DRAFacts
from gpu_operator.render.transforms.hardening import REQUESTS_ONLY, SMALL, default_resources, harden_pod
from tests.unit.render.renderkit import daemonset, facts, run

ROOT = Path(__file__).resolve().parents[3]


def example(name: str) -> RenderResult:
    return render(load_policy(ROOT / "examples" / f"clusterpolicy-{name}.yaml"), facts("dgx-h100:2"))


def containers(ds: dict[str, Any]) -> list[dict[str, Any]]:
    pod = ds["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def test_every_operand_container_has_requests_and_only_kernel_module_builders_go_without_limits() -> None:
    result = run()
    for state in result.states:
        for o in state.objects:
            if o["kind"] != "DaemonSet":
                continue
            for ctr in containers(o):
                res = ctr["resources"]
                assert set(res["requests"]) == {"cpu", "memory"}, (o["metadata"]["name"], ctr["name"])
                if ctr["name"] in ("nvidia-driver-ctr", "mps-control-daemon-ctr"):
                    assert "limits" not in res
                else:
                    assert set(res["limits"]) == {"cpu", "memory"}, (o["metadata"]["name"], ctr["name"])


def test_the_policys_resources_replace_the_defaults() -> None:
    mine = {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    ds = daemonset(run({"dcgm": {"resources": mine}}), "state-dcgm")
    assert [c["resources"] for c in containers(ds)] == [mine, mine]  # upstream: every container of the pod
    ds = daemonset(run({"driver": {"resources": mine}}), "state-driver")
    assert {c["name"]: c["resources"] for c in containers(ds)}["nvidia-driver-ctr"] == mine


def test_no_token_where_no_role_and_a_token_where_the_component_calls_the_apiserver() -> None:
    result = run()
    dcgm = daemonset(result, "state-dcgm")["spec"]["template"]["spec"]
    assert dcgm["automountServiceAccountToken"] is False
    assert not [o for o in result.state("state-dcgm").objects if o["kind"] in ("Role", "ClusterRole")]
    for state in (
        "state-driver",
        "state-operator-validation",
        "state-device-plugin",
        "gpu-feature-discovery",
    ):
        pod = daemonset(result, state)["spec"]["template"]["spec"]
        assert "automountServiceAccountToken" not in pod, state


def test_privileged_containers_are_left_as_the_runtime_runs_them() -> None:
    """No capabilities.drop or seccomp profile written where the runtime would ignore it."""
    ds = daemonset(run(), "state-driver")
    pod = ds["spec"]["template"]["spec"]
    assert "securityContext" not in pod
    for ctr in containers(ds):
        assert ctr["securityContext"]["privileged"] is True
        assert "capabilities" not in ctr["securityContext"]


def test_a_container_that_is_not_privileged_drops_every_capability_under_runtime_default_seccomp() -> None:
    pod: dict[str, Any] = {
        "containers": [
            {"name": "a", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
            {"name": "b", "securityContext": {"privileged": True}},
        ]
    }
    harden_pod(pod, api_access=True)
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"] == {
        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
        "allowPrivilegeEscalation": False,
    }
    assert pod["containers"][1]["securityContext"] == {"privileged": True}
    assert "automountServiceAccountToken" not in pod
    mine: dict[str, Any] = {
        "securityContext": {"seccompProfile": {"type": "Unconfined"}, "runAsUser": 7},
        "containers": [{"name": "a"}],
    }
    harden_pod(mine, api_access=False)
    assert mine["securityContext"]["seccompProfile"] == {"type": "Unconfined"}  # the policy's word stands
    assert mine["automountServiceAccountToken"] is False


def test_the_dra_controller_runs_restricted() -> None:
    facts = DRAFacts(namespace="gpu-operator", operator_env=dict(CHART_DEFAULT_IMAGES))
    result = render_gpucluster(load_gpucluster(ROOT / "examples" / "gpucluster.yaml"), facts)
    deployment = next(o for s in result.states for o in s.objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for ctr in pod["containers"]:
        assert ctr["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
        assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
        assert ctr["securityContext"]["runAsNonRoot"] is True
        assert ctr["resources"] == SMALL


@pytest.mark.parametrize(("name", "expected"), [("nvidia-driver-ctr", REQUESTS_ONLY), ("gpu-health", SMALL)])
def test_default_resources(name: str, expected: dict[str, Any]) -> None:
    assert default_resources(name) == expected


def test_vfio_manager_and_vgpu_host_state_write_only_what_they_write() -> None:
    """The host root read-only; read-write only sysfs, the agent's record and its status file."""
    result = example("vm-vgpu")
    vfio = daemonset(example("vm-passthrough"), "state-vfio-manager", "nvidia-vfio-manager")
    for ds, name, writable in (
        (vfio, "nvidia-vfio-manager", {"/sys", "/host/sys"}),
        (
            daemonset(result, "state-sandbox-validation"),
            "vgpu-host-state",
            {"/sys", "/host/sys", "/host/var/lib/gpu-operator", "/host/run/nvidia/validations"},
        ),
    ):
        pod = ds["spec"]["template"]["spec"]
        ctr = next(c for c in containers(ds) if c["name"] == name)
        volumes = {v["name"]: v for v in pod["volumes"]}
        rw = {m["mountPath"] for m in ctr["volumeMounts"] if not m.get("readOnly")}
        assert rw == writable, name
        host = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/host")
        assert host["readOnly"] is True and volumes[host["name"]]["hostPath"]["path"] == "/"
        assert volumes["host-sys"]["hostPath"]["path"] == "/sys"
    pod = daemonset(result, "state-sandbox-validation")["spec"]["template"]["spec"]
    record = next(v for v in pod["volumes"] if v["name"] == "vgpu-host-state-record")
    assert record["hostPath"] == {"path": "/var/lib/gpu-operator", "type": "DirectoryOrCreate"}
