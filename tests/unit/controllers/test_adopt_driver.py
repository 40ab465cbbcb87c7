"""The take-over sweep (controllers/adopt.py) never deletes a driver DaemonSet that has pods: its
pods would go with it, and a driver pod that goes unloads the driver under the jobs on its node."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_operator.controllers import adopt
from tests.unit.controllers.test_apply_selector import ListingKube

OWNER = "nvidiadriver-uid"


def daemonset(name: str, component: str, status: dict[str, Any] | None) -> dict[str, Any]:
    refs = [{"uid": OWNER, "controller": True, "kind": "NVIDIADriver", "name": "default"}]
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "ns", "ownerReferences": refs},
        "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/component": component}}}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_a_driver_daemonset_with_pods_is_kept_one_without_pods_and_other_operands_go() -> None:
    counted = {"observedGeneration": 1, "desiredNumberScheduled": 3}
    kube = ListingKube(
        [
            daemonset("driver-running", "nvidia-driver", {**counted, "currentNumberScheduled": 3}),
            daemonset("driver-misscheduled", "nvidia-driver", {**counted, "numberMisscheduled": 1}),
            daemonset("driver-not-counted-yet", "nvidia-driver", None),
            daemonset("driver-without-pods", "nvidia-driver", {"observedGeneration": 1}),
            daemonset("other-operand", "gpu-feature-discovery", {**counted, "currentNumberScheduled": 3}),
        ]
    )
    gone = asyncio.run(adopt.sweep(kube, OWNER, {"ns"}, set(), keep_kinds=()))  # type: ignore[arg-type]
    assert sorted(kube.deleted) == ["DaemonSet/driver-without-pods", "DaemonSet/other-operand"]
    assert len(gone) == 2
