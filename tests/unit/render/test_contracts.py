"""Every rendered object of every example policy (and an all-operands policy) against the operand contracts.

The contracts (tools/operand_facts/contracts/*.yaml) hold upstream's facts per image: env, mounts,
privilege, the program each container runs, status files, RBAC, Services. A deviation must be
listed as deliberate, with its reason, in its contract and in docs/operands.md.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
from tools.operand_facts.compare import policies, render_policy
from tools.operand_facts.contract import Deviation, compare_state, contracts, undocumented

from gpu_operator.render.defaults import CUDA_WORKLOAD_IMAGE, OWN_IMAGE
from tests.unit.render.renderkit import STATE_NAMES

ROOT = Path(__file__).resolve().parents[3]
POLICIES = policies()
SHELL = {"sh", "echo", "until", "<image entrypoint>"}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_rendered_object_keeps_its_contract(name: str) -> None:
    result = render_policy(POLICIES[name])
    assert any(s.enabled and s.objects for s in result.states)
    found = [d for s in result.states if s.enabled for d in compare_state(s.name, s.objects)]
    assert undocumented(found) == [], "\n".join(map(str, undocumented(found)))


def test_every_state_has_a_contract_and_the_policies_reach_them_all() -> None:
    # (the GPUCluster's states have theirs, keyed gpucluster/<state>: tests/unit/render/test_dra.py)
    assert {k for k in contracts() if not k.startswith("gpucluster/")} == set(STATE_NAMES)
    rendered = {s.name for p in POLICIES.values() for s in render_policy(p).states if s.enabled and s.objects}
    # the kata manager is deprecated and never rendered (it only cleans up after itself)
    assert rendered == set(STATE_NAMES) - {"state-kata-manager"}


def test_the_check_catches_the_node_stopping_deviations() -> None:
    """Undo each node-stopping fix on a rendered object: the contract check must name it."""
    result = render_policy(POLICIES["clusterpolicy-default.yaml"])
    state = result.state("state-operator-validation")
    broken = copy.deepcopy(state.objects)
    ds = next(o for o in broken if o["kind"] == "DaemonSet")
    for ctr in ds["spec"]["template"]["spec"]["initContainers"]:
        ctr["env"] = [
            e for e in ctr.get("env", []) if e["name"] not in ("OPERATOR_NAMESPACE", "NVIDIA_VISIBLE_DEVICES")
        ]
    ids = {d.id for d in undocumented(compare_state(state.name, broken))}
    assert "nvidia-operator-validator/toolkit-validation:env-missing:NVIDIA_VISIBLE_DEVICES" in ids
    assert "nvidia-operator-validator/cuda-validation:env-missing:OPERATOR_NAMESPACE" in ids
    toolkit = result.state("state-container-toolkit")
    broken = copy.deepcopy(toolkit.objects)
    for o in broken:
        if o["kind"] == "Role":
            o["rules"] = [r for r in o["rules"] if "daemonsets" not in r["resources"]]
        if o["kind"] == "DaemonSet":
            o["spec"]["template"]["spec"]["initContainers"][0]["securityContext"].pop("runAsUser")
    ids = {d.id for d in undocumented(compare_state(toolkit.name, broken))}
    assert "state-container-toolkit:Role:rule-missing:apps daemonsets list" in ids
    assert "nvidia-container-toolkit-daemonset/driver-validation:runAsUser" in ids
    gfd = result.state("gpu-feature-discovery")
    broken = copy.deepcopy(gfd.objects)
    for o in broken:
        if o["kind"] == "DaemonSet":
            main = o["spec"]["template"]["spec"]["containers"][0]
            main["env"] = [e for e in main["env"] if e["name"] != "NODE_NAME"]
    found: list[Deviation] = undocumented(compare_state(gfd.name, broken))
    assert [d.id for d in found] == ["gpu-feature-discovery/gpu-feature-discovery:env-missing:NODE_NAME"]


def test_our_image_runs_only_what_our_package_provides() -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    assert {"gpu-operator", "nvidia-validator"} <= scripts
    from tools.operand_facts.contract import runs

    for policy in POLICIES.values():
        for obj in render_policy(policy).objects():
            if obj["kind"] != "DaemonSet":
                continue
            pod = obj["spec"]["template"]["spec"]
            for ctr in [*pod.get("initContainers", []), *pod["containers"]]:
                if ctr["image"] == OWN_IMAGE:
                    assert runs(ctr) in scripts | SHELL, (obj["metadata"]["name"], ctr["name"], runs(ctr))


def test_workload_pods_name_an_image_that_has_vectoradd() -> None:
    """The cuda check's workload pod runs vectorAdd by default: NVIDIA's image, which has it. The
    plugin check runs no workload pod (WITH_WORKLOAD=false), so its container names no CUDA image."""
    result = render_policy(POLICIES["clusterpolicy-default.yaml"])
    ds = next(o for o in result.state("state-operator-validation").objects if o["kind"] == "DaemonSet")
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]]
    assert {"cuda-validation", "plugin-validation"} <= set(names), names
    envs = {
        ctr["name"]: {e["name"]: e.get("value") for e in ctr["env"]}
        for ctr in ds["spec"]["template"]["spec"]["initContainers"]
    }
    assert envs["cuda-validation"]["CUDA_VALIDATOR_IMAGE"] == CUDA_WORKLOAD_IMAGE != OWN_IMAGE
    assert "CUDA_WORKLOAD" not in envs["cuda-validation"]  # the validator's default: vectorAdd
    assert envs["plugin-validation"]["WITH_WORKLOAD"] == "false"
    assert "CUDA_VALIDATOR_IMAGE" not in envs["plugin-validation"]
    for name in ("cuda-validation", "plugin-validation"):
        assert envs[name]["VALIDATOR_IMAGE"] == OWN_IMAGE


def test_every_deliberate_deviation_is_documented() -> None:
    docs = (ROOT / "docs" / "operands.md").read_text()
    from tools.operand_facts.contract import shared_deliberate

    patterns = [p for c in contracts().values() for p in c.deliberate] + list(shared_deliberate())
    assert [p for p in patterns if f"`{p}`" not in docs] == []


VALIDATOR_TEMPLATE: dict[str, Any] = {
    "ownerReferences": [
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": "cluster-policy",
            "uid": "u",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ],
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "serviceAccountName": "nvidia-operator-validator",
}


def _workload_pods(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from gpu_operator.node.validate.workload import CUDA_APP, PLUGIN_APP, workload_pod

    common: dict[str, Any] = {
        "node_name": "gpu-0",
        "namespace": "gpu-operator",
        "image": CUDA_WORKLOAD_IMAGE,
        "template": template,
        "runtime_class": "nvidia",
    }
    return {
        CUDA_APP: workload_pod(CUDA_APP, **common),
        PLUGIN_APP: workload_pod(PLUGIN_APP, gpu_resource="nvidia.com/gpu", **common),
    }


def test_the_validators_workload_pods_keep_their_contract() -> None:
    """Objects our code creates at run time, checked like the rendered ones."""
    from tools.operand_facts.workload import check

    contract = contracts()["state-operator-validation"]
    facts = contract.data["workload_pods"]
    pods = _workload_pods(VALIDATOR_TEMPLATE)
    assert set(pods) == set(facts)
    found = [
        d
        for app, pod in pods.items()
        for d in check(contract.state, app, pod, facts[app], VALIDATOR_TEMPLATE["tolerations"])
    ]
    assert [str(d) for d in found if not contract.explains(d)] == []
    assert {d.id for d in found} == {
        "workload:nvidia-cuda-validator:restartPolicy",
        "workload:nvidia-device-plugin-validator:restartPolicy",
    }  # the deliberate ones


def test_the_workload_check_catches_what_would_break_a_real_node() -> None:
    from tools.operand_facts.workload import check

    contract = contracts()["state-operator-validation"]
    pods = _workload_pods({**VALIDATOR_TEMPLATE, "serviceAccountName": ""})
    cuda = pods["nvidia-cuda-validator"]
    cuda["spec"]["initContainers"][0]["name"] = "cuda-workload"  # the CDI annotation would miss it
    cuda["spec"]["initContainers"][0]["env"] = []  # NVIDIA_VISIBLE_DEVICES=void from the image: no GPU
    ids = {
        d.id
        for d in check(
            contract.state,
            "nvidia-cuda-validator",
            cuda,
            contract.data["workload_pods"]["nvidia-cuda-validator"],
            VALIDATOR_TEMPLATE["tolerations"],
        )
    }
    assert {
        "workload:nvidia-cuda-validator:serviceAccount",
        "workload:nvidia-cuda-validator:init.name",
        "workload:nvidia-cuda-validator:init.env.NVIDIA_VISIBLE_DEVICES",
    } <= ids, ids
