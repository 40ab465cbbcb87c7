"""The chart's gpu-operator-node-agents policy lists, per node agent, the Node keys that agent writes;
they are the operator's vocabulary, repeated in the template (Go templates cannot import it). This
holds the two together, and the agents' ServiceAccounts to the renderer's names."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import yaml

from gpu_operator import vocabulary as v
from gpu_operator.node.discover import OWNED_ANNOTATION
from gpu_operator.node.vgpuhost.agent import VGPU_HOST_RESULT_ANNOTATION, VGPU_HOST_STATE
from gpu_operator.render.dra import validation as dra_validation
from gpu_operator.render.states import operator_validation, sandbox_validation, vfio_manager
from tests.support.chart import CHART

NS = "gpu-operator"
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def policies() -> list[dict[str, Any]]:
    helm = os.environ.get("GPU_OPERATOR_HELM") or shutil.which("helm")
    assert helm, "GPU_OPERATOR_HELM names no helm (export it: tools/helm/build.sh | tail -n1)"
    done = subprocess.run(
        [
            helm,
            "template",
            "gpu-operator",
            str(CHART),
            "-n",
            NS,
            "--api-versions",
            VAP,
            "--show-only",
            "templates/admission.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def owned_keys() -> dict[str, list[str]]:
    policy = next(p for p in policies() if p["metadata"]["name"] == "gpu-operator-node-agents")
    (owned,) = [x["expression"] for x in policy["spec"]["variables"] if x["name"] == "owned"]
    literal = re.fullmatch(r"(\{.*\})\[request\.userInfo\.username\]", owned)
    assert literal, owned
    parsed: dict[str, list[str]] = json.loads(literal.group(1))
    return {user.removeprefix(f"system:serviceaccount:{NS}:"): keys for user, keys in parsed.items()}


def test_each_node_agent_may_change_exactly_the_keys_it_writes() -> None:
    nfd = [
        *v.NFD_GPU_LABELS,
        f"{v.NFD_DEVICE_LABEL_PREFIX}*",
        v.NFD_HYPERVISOR,
        v.KERNEL_FULL,
        v.OS_ID,
        v.OS_VERSION_ID,
        v.OS_VERSION_MAJOR,
        f"{v.OS_VERSION_ID}.minor",
    ]
    assert {k: sorted(keys) for k, keys in owned_keys().items()} == {
        "gpu-operator-node-discovery": sorted([*nfd, OWNED_ANNOTATION]),
        vfio_manager.PROBE: sorted(
            [v.DRIVER_SOURCE, v.DRIVER_VERSION, v.PROBE_STATUS, v.PROBE_FACTS_ANNOTATION]
        ),
        vfio_manager.NAME: sorted([v.VFIO_STATE, v.VFIO_RESULT_ANNOTATION]),
        sandbox_validation.NAME: sorted([VGPU_HOST_STATE, VGPU_HOST_RESULT_ANNOTATION]),
        operator_validation.NAME: [v.HEALTH_REPORT_ANNOTATION],
        dra_validation.NAME: [v.HEALTH_REPORT_ANNOTATION],
    }


def test_the_policies_are_not_rendered_where_the_api_is_not_served() -> None:
    helm = os.environ.get("GPU_OPERATOR_HELM") or shutil.which("helm")
    assert helm
    done = subprocess.run(
        [helm, "template", "gpu-operator", str(CHART), "-n", NS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(done.stdout) if d}
    assert "ClusterRole" in kinds and not {k for k in kinds if k.startswith("ValidatingAdmissionPolicy")}
