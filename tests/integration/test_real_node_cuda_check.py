"""The validator's CUDA check with CUDA_WORKLOAD=driver-api on the real node: the workload pod runs
`gpu-operator node cuda-check` from our own image (no CUDA image), through the `nvidia` runtime.
The libcuda.so.1 the runtime injects there is an empty stand-in (no GPU on this machine), so the
check must fail, and its last line must reach the validator's termination message: that proves
the pod's spec, the command in our image and the message path, not CUDA on a GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightkube import Client

from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.sim.realnode.realnode import RealNode
from gpu_operator.sim.realnode.realspec import policy_spec
from tests.integration.realnode_fixtures import IMAGE
from tests.integration.test_real_node_operator import _context, _failed_init, _pods
from tests.support.status import policy_status
from tests.support.waiting import wait_for

DRIVER_API = [
    {"name": "CUDA_WORKLOAD", "value": "driver-api"},
    {"name": "CUDA_TIMEOUT_SECONDS", "value": "60"},
]


def _check_ended(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The workload pod's init container's terminated state, once it ended."""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if cs["name"] == "cuda-validation" and (cs.get("state") or {}).get("terminated"):
                return dict(cs["state"]["terminated"])
    return None


def test_driver_api_runs_our_check_in_our_image_and_its_last_line_reaches_the_validator(
    control_plane: ControlPlane,
    kube: Client,
    real_gpu_node: RealNode,
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    assert real_gpu_node.host_root is not None
    operator = start_operator()
    spec = policy_spec(real_gpu_node.host_root)
    spec["validator"]["cuda"] = {"env": DRIVER_API}  # and no CUDA_VALIDATOR_IMAGE: no sample image
    cluster_policies(spec)
    ns = operator_namespace
    context = _context(kube, ns, operator)

    message = wait_for(
        "the real node's CUDA validation to fail",
        lambda: _failed_init(kube, ns, "cuda-validation"),
        timeout=240,
        interval=2,
        context=context,
    )
    # The validator retries: its next attempt deletes the ended workload pod and makes a new one, so
    # the pod whose check ended is waited for, not read once.
    pod = wait_for(
        "a CUDA workload pod whose check ended",
        lambda: next((p for p in _pods(kube, ns, "nvidia-cuda-validator") if _check_ended([p])), None),
        until=lambda found: found is not None,
        timeout=180,
        interval=0.5,
        context=context,
    )
    assert pod is not None
    (init,) = pod["spec"]["initContainers"]
    assert init["image"] == IMAGE and init["command"] == ["gpu-operator", "node", "cuda-check"]
    ended = _check_ended([pod])
    assert ended is not None and ended["exitCode"] == 1, pod.get("status")
    lines = ended["message"].strip().splitlines()
    # it ran: the device nodes the runtime gave, then the injected library, which cannot load
    assert lines[0].startswith("cuda-check: device nodes: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia0"), (
        lines
    )
    last = lines[-1]
    assert last.startswith(
        "cuda-check: FAILED: libcuda.so.1 at /usr/lib/x86_64-linux-gnu/libcuda.so.1 cannot be loaded ("
    ), last
    # the validator's own message (its termination message) quotes that last line whole
    print(f"\nthe workload pod's termination message:\n{ended['message']}\nthe validator's:\n{message}")
    assert last in message, message
    assert policy_status(kube).get("state") != "ready"
