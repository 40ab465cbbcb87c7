"""Every operand DaemonSet tolerates the startup taint the policy names (spec.health.startupTaint:
enabled, or a key other than the default), so validation runs on a node that still carries it:
a Node Readiness Controller removes its readiness.k8s.io/ taint only once NvidiaGPUReady is True,
which needs the validator's pods on the node. A policy that names none renders as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.healthpolicy import DEFAULT_STARTUP_TAINT
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.render import render
from gpu_operator.render.nvidiadriver import render_nvidiadriver
from gpu_operator.render.transforms.daemonset import common_config
from gpu_operator.vocabulary import HEALTH_TAINT
from tests.unit.render.renderkit import facts, policy, run

ROOT = Path(__file__).resolve().parents[3]
READINESS = "readiness.k8s.io/nvidia-gpu-ready"
# every state the defaults leave off, on: the test covers each operand DaemonSet the policy renders
EVERYTHING = {
    "gds": {"enabled": True},
    "gdrcopy": {"enabled": True},
    "kataManager": {"enabled": True},
    "ccManager": {"enabled": True},
    "sandboxWorkloads": {"enabled": True},
}


def _daemonsets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "DaemonSet"]


def _tolerations(ds: dict[str, Any]) -> list[dict[str, Any]]:
    tolerations: list[dict[str, Any]] = ds["spec"]["template"]["spec"]["tolerations"]
    return tolerations


@pytest.mark.parametrize(
    "startup",
    [
        {"key": READINESS},  # left to another controller: named, not enabled
        {"enabled": True, "key": READINESS},
        {"enabled": True},  # the operator removes the default (cluster-autoscaler) key
    ],
)
def test_every_operand_daemonset_tolerates_the_named_startup_taint(startup: dict[str, Any]) -> None:
    key = startup.get("key", DEFAULT_STARTUP_TAINT)
    daemonsets = _daemonsets(
        run({**EVERYTHING, "health": {"startupTaint": startup}}, "dgx-h100:2", "a10:1").objects()
    )
    for name in ("default", "vm-passthrough", "vm-vgpu"):  # the shipped policies: the sandbox states too
        data = yaml.safe_load((ROOT / "examples" / f"clusterpolicy-{name}.yaml").read_text())
        data["spec"]["health"] = {"startupTaint": startup}
        daemonsets += _daemonsets(render(ClusterPolicy.model_validate(data), facts("dgx-h100:2")).objects())
    names = {d["metadata"]["name"] for d in daemonsets}
    assert len(names) >= 14 and "nvidia-vfio-manager" in names, sorted(names)
    for ds in daemonsets:
        assert {"key": key, "operator": "Exists"} in _tolerations(ds), ds["metadata"]["name"]


def test_an_nvidiadriver_pool_tolerates_the_clusterpolicys_startup_taint() -> None:
    nvd = NVIDIADriver.model_validate({"metadata": {"name": "pool"}, "spec": {"driverType": "gpu"}})
    base = policy({"health": {"startupTaint": {"key": READINESS}}})
    daemonsets = _daemonsets(render_nvidiadriver(nvd, facts("dgx-h100:1"), base).objects())
    assert daemonsets
    for ds in daemonsets:
        assert {"key": READINESS, "operator": "Exists"} in _tolerations(ds), ds["metadata"]["name"]


@pytest.mark.parametrize(
    "health",
    [None, {}, {"startupTaint": {"enabled": False}}, {"startupTaint": {"key": DEFAULT_STARTUP_TAINT}}],
)
def test_a_policy_that_names_no_startup_taint_adds_no_toleration(health: dict[str, Any] | None) -> None:
    spec = {**EVERYTHING, **({"health": health} if health is not None else {})}
    for ds in _daemonsets(run(spec).objects()):
        keys = [t.get("key") for t in _tolerations(ds)]
        assert DEFAULT_STARTUP_TAINT not in keys and not any(
            str(k).startswith("readiness.k8s.io/") for k in keys
        )


def test_the_policys_own_tolerations_keep_theirs_and_one_of_every_taint_needs_none() -> None:
    def tolerations(daemonsets: dict[str, Any]) -> list[dict[str, Any]]:
        ds: dict[str, Any] = {
            "metadata": {},
            "spec": {"template": {"metadata": {}, "spec": {"containers": []}}},
        }
        common_config(
            ds, policy({"daemonsets": daemonsets, "health": {"startupTaint": {"key": READINESS}}}).spec
        )
        return _tolerations(ds)

    assert tolerations({"tolerations": [{"key": "pool", "operator": "Exists"}]}) == [
        {"key": "pool", "operator": "Exists"},
        {"key": HEALTH_TAINT, "operator": "Exists"},
        {"key": READINESS, "operator": "Exists"},
    ]
    assert tolerations({"tolerations": [{"operator": "Exists"}]}) == [{"operator": "Exists"}]
    # one for the key with a single effect leaves the others: the toleration of every effect is added
    only = [{"key": READINESS, "operator": "Exists", "effect": "NoSchedule"}]
    assert tolerations({"tolerations": only})[-1] == {"key": READINESS, "operator": "Exists"}
