"""The status view's table builder and renderer, on hand-made nodes, DaemonSets, pods and policies."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpu_operator.statusview.render import render_view
from gpu_operator.statusview.table import (
    CANONICAL_ORDER,
    build_view,
    validation_state,
)

DEPLOY = "nvidia.com/gpu.deploy."


def node(name: str, gpu: bool = True, **deploy: str) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if gpu:
        labels["feature.node.kubernetes.io/pci-10de.present"] = "true"
        labels["nvidia.com/gpu.present"] = "true"
    labels.update({DEPLOY + k.replace("_", "-"): v for k, v in deploy.items()})
    return {"metadata": {"name": name, "labels": labels}}


def daemonset(name: str, component: str, **extra_selector: str) -> dict[str, Any]:
    selector = {DEPLOY + component: "true", **extra_selector}
    return {
        "metadata": {"name": name, "namespace": "gpu-operator", "uid": f"uid-{name}"},
        "spec": {"template": {"spec": {"nodeSelector": selector}}},
    }


def pod(
    ds: str,
    node_name: str,
    phase: str = "Running",
    ready: bool = True,
    waiting: str | None = None,
    init: list[tuple[str, int | None]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {"name": "main", "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}}}
        ],
    }
    if init is not None:
        status["initContainerStatuses"] = [
            {"name": n, "state": {"terminated": {"exitCode": code}} if code is not None else {"running": {}}}
            for n, code in init
        ]
    return {
        "metadata": {
            "name": f"{ds}-{node_name}",
            "namespace": "gpu-operator",
            "ownerReferences": [{"kind": "DaemonSet", "name": ds, "uid": f"uid-{ds}"}],
        },
        "spec": {"nodeName": node_name},
        "status": status,
    }


def policy(
    name: str = "cluster-policy",
    state: str = "ready",
    created: str = "2026-01-01T00:00:00Z",
    reason: str = "Reconciled",
    message: str = "",
) -> dict[str, Any]:
    ok = state == "ready"
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {
            "state": state,
            "namespace": "gpu-operator",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ok else "False",
                    "reason": reason if ok else "Error",
                    "message": message if ok else "",
                },
                {
                    "type": "Error",
                    "status": "False" if ok else "True",
                    "reason": "Ready" if ok else reason,
                    "message": "" if ok else message,
                },
            ],
        },
    }


def test_everything_running_is_ready_and_cpu_nodes_are_counted_not_shown() -> None:
    nodes = [
        node("gpu-a", driver="true", device_plugin="true"),
        node("gpu-b", driver="true", device_plugin="true"),
        node("cpu-a", gpu=False),
    ]
    dss = [
        daemonset("nvidia-driver-daemonset", "driver"),
        daemonset("nvidia-device-plugin-daemonset", "device-plugin"),
    ]
    pods = [pod(ds["metadata"]["name"], n) for ds in dss for n in ("gpu-a", "gpu-b")]
    view = build_view(nodes, dss, pods, [policy()], "gpu-operator")
    assert view.ready and view.problems == []
    assert [r.name for r in view.rows] == ["gpu-a", "gpu-b"] and view.other_nodes == 1
    assert view.components == ["driver", "device-plugin"]
    assert view.counts() == (4, 4)
    cell = view.rows[0].cells["driver"]
    assert (cell.label, cell.pod, cell.ready) == ("true", "Running", True)


def test_not_ready_pods_are_grouped_by_component_and_reason() -> None:
    names = [f"gpu-{i}" for i in range(5)]
    nodes = [node(n, driver="true") for n in names]
    ds = daemonset("nvidia-driver-daemonset", "driver")
    pods = [
        pod("nvidia-driver-daemonset", n, phase="Pending", ready=False, waiting="ImagePullBackOff")
        for n in names[:4]
    ]
    view = build_view(nodes, [ds], pods, [policy()])
    assert not view.ready
    assert view.problems == [
        "driver not ready on 4 node(s) (gpu-0, gpu-1, gpu-2 and 1 more): main: ImagePullBackOff",
        "driver not ready on 1 node(s) (gpu-4): no pod of DaemonSet nvidia-driver-daemonset yet",
    ]
    assert view.rows[4].cells["driver"].pod == "no pod"


def test_a_label_other_than_true_or_no_operand_expects_nothing() -> None:
    nodes = [node("gpu-a", driver="pre-installed", client="true")]
    view = build_view(nodes, [daemonset("nvidia-driver-daemonset", "driver")], [], [policy()])
    driver, client = view.rows[0].cells["driver"], view.rows[0].cells["client"]
    assert (driver.label, driver.expected) == ("pre-installed", False)
    assert (client.label, client.expected) == ("true", False)  # no DaemonSet is gated by it
    assert view.ready


def test_a_daemonset_with_an_extra_selector_only_counts_where_it_selects() -> None:
    # The MPS control daemon shares the device-plugin label but also needs mps.capable=true.
    mps_node = node("gpu-mps", device_plugin="true")
    mps_node["metadata"]["labels"]["nvidia.com/mps.capable"] = "true"
    nodes = [node("gpu-a", device_plugin="true"), mps_node]
    dss = [
        daemonset("plugin", "device-plugin"),
        daemonset("mps", "device-plugin", **{"nvidia.com/mps.capable": "true"}),
    ]
    pods = [pod("plugin", "gpu-a"), pod("plugin", "gpu-mps")]
    view = build_view(nodes, dss, pods, [policy()])
    assert view.rows[0].cells["device-plugin"].ready is True
    mps = [r for r in view.rows if r.name == "gpu-mps"][0].cells["device-plugin"]
    assert (mps.ready, mps.pod) == (False, "Running/no pod")
    assert "no pod of DaemonSet mps yet" in mps.detail


def test_daemonsets_split_by_node_affinity_count_only_where_they_schedule() -> None:
    """The driver split for VM guests (NVIDIA's DaemonSet NotIn the guest by name, ours In it) and the
    toolkit split by runtime (NotIn/In on the runtime-group label): each node is counted against the
    DaemonSet whose pod the scheduler would place there, not against both."""

    def affine(ds: dict[str, Any], **term: Any) -> dict[str, Any]:
        ds["spec"]["template"]["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
        return ds

    guest, dgx = node("guest-0", driver="true"), node("dgx-0", driver="true")
    k3s = node("k3s-0", container_toolkit="true")
    k3s["metadata"]["labels"]["nvidia.com/gpu.container-runtime"] = "k3s"
    stock_node = node("plain-0", container_toolkit="true")
    dss = [
        affine(
            daemonset("nvidia-driver-daemonset", "driver"),
            matchFields=[{"key": "metadata.name", "operator": "NotIn", "values": ["guest-0"]}],
        ),
        affine(
            daemonset("nvidia-driver-daemonset-guest-nvlink-off", "driver"),
            matchFields=[{"key": "metadata.name", "operator": "In", "values": ["guest-0"]}],
        ),
        affine(
            daemonset("toolkit", "container-toolkit"),
            matchExpressions=[
                {"key": "nvidia.com/gpu.container-runtime", "operator": "NotIn", "values": ["k3s"]}
            ],
        ),
        affine(
            daemonset("toolkit-k3s", "container-toolkit"),
            matchExpressions=[
                {"key": "nvidia.com/gpu.container-runtime", "operator": "In", "values": ["k3s"]}
            ],
        ),
    ]
    pods = [
        pod("nvidia-driver-daemonset", "dgx-0"),
        pod("nvidia-driver-daemonset-guest-nvlink-off", "guest-0"),
        pod("toolkit", "plain-0"),
        pod("toolkit-k3s", "k3s-0"),
    ]
    view = build_view([guest, dgx, k3s, stock_node], dss, pods, [policy()])
    cells = {r.name: r.cells for r in view.rows}
    assert cells["guest-0"]["driver"].ready is True, cells["guest-0"]["driver"].detail
    assert cells["dgx-0"]["driver"].ready is True
    assert cells["k3s-0"]["container-toolkit"].ready is True, cells["k3s-0"]["container-toolkit"].detail
    assert cells["plain-0"]["container-toolkit"].ready is True


def test_validation_state_follows_the_validator_init_containers() -> None:
    steps = ["driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"]
    assert validation_state(None) == ""
    assert validation_state(pod("v", "n", init=[(s, 0) for s in steps])) == "passed (4/4)"
    assert (
        validation_state(pod("v", "n", init=[(steps[0], 0), (steps[1], None), (steps[2], None)]))
        == "waiting: toolkit-validation"
    )
    assert validation_state(pod("v", "n", init=[(steps[0], 1)])) == "failed: driver-validation"
    nodes = [node("gpu-a", operator_validator="true")]
    ds = daemonset("nvidia-operator-validator", "operator-validator")
    view = build_view(
        nodes, [ds], [pod("nvidia-operator-validator", "gpu-a", init=[(s, 0) for s in steps])], [policy()]
    )
    assert view.rows[0].validation == "passed (4/4)"


def test_policy_state_and_reasons() -> None:
    nodes = [node("gpu-a")]
    assert build_view(nodes, [], [], []).problems[0].startswith("no ClusterPolicy")
    failing = policy(state="notReady", reason="OperandNotReady", message="states not ready: [state-driver]")
    view = build_view(nodes, [], [], [failing])
    assert view.policy is not None and view.policy.reason == "OperandNotReady"
    assert view.problems == [
        "ClusterPolicy cluster-policy: notReady (OperandNotReady: states not ready: [state-driver])"
    ]
    fresh = {"metadata": {"name": "cluster-policy", "creationTimestamp": "2026-01-01T00:00:00Z"}}
    assert build_view(nodes, [], [], [fresh]).problems == ["ClusterPolicy cluster-policy: not reconciled yet"]
    # Only the oldest policy is active; a later one is reported as ignored.
    view = build_view(nodes, [], [], [policy("newer", created="2026-02-01T00:00:00Z"), policy("older")])
    assert view.policy is not None and (view.policy.name, view.policy.ignored) == ("older", ("newer",))
    assert view.problems == ["ClusterPolicy newer ignored: only the oldest one (older) is active"]
    assert build_view([node("cpu", gpu=False)], [], [], [policy()]).problems == [
        "no GPU node: none carries nvidia.com/gpu.present=true or an NFD pci-10de label"
    ]


def test_a_policy_that_saw_no_gpu_node_is_not_ready_once_gpu_nodes_exist() -> None:
    # The operator's first reconcile may run before it labelled any node: ready (NoGPUNodes).
    behind = policy(reason="NoGPUNodes")
    assert build_view([node("cpu", gpu=False)], [], [], [behind]).ready
    view = build_view([node("gpu-a", driver="true")], [], [], [behind])
    assert not view.ready
    assert view.problems == [
        "ClusterPolicy cluster-policy: NoGPUNodes while 1 GPU node(s) exist: the "
        "operator has not reconciled since they appeared"
    ]


def test_columns_follow_the_upstream_state_order() -> None:
    nodes = [node("gpu-a", operator_validator="true", driver="true", mig_manager="true", zz_custom="true")]
    view = build_view(nodes, [], [], [policy()])
    assert view.components == ["driver", "mig-manager", "operator-validator", "zz-custom"]
    assert CANONICAL_ORDER.index("mig-manager") < CANONICAL_ORDER.index("node-status-exporter")


def test_render_shows_cells_policy_problems_and_a_footnote() -> None:
    nodes = [node("gpu-a", driver="true", client="true"), node("gpu-b", driver="true", client="true")]
    ds = daemonset("nvidia-driver-daemonset", "driver")
    pods = [
        pod("nvidia-driver-daemonset", "gpu-a"),
        pod("nvidia-driver-daemonset", "gpu-b", phase="Pending", ready=False, waiting="ErrImagePull"),
    ]
    console = Console(record=True, width=140)
    console.print(render_view(build_view(nodes, [ds], pods, [policy()], "gpu-operator"), max_nodes=1))
    text = console.export_text()
    assert "ClusterPolicy cluster-policy: ready (Reconciled)" in text
    assert "… Pending" in text and "gpu-b" in text  # not-ready rows first
    assert "… 1 more (0 not ready)" in text
    assert "driver not ready on 1 node(s) (gpu-b): main: ErrImagePull" in text
    assert "without an operand here (disabled or another stack): client" in text


def test_pod_problem_carries_the_validators_termination_message() -> None:
    from gpu_operator.statusview.table import pod_problem

    message = (
        "cuda: the nvidia-cuda-validator pod on node gpu-1 ended Pending within 300s: "
        "ImagePullBackOff: nvcr.io/nvidia/gpu-operator:v0 not found"
    )
    pod = {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": "driver-validation", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "cuda-validation",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
                },
            ],
        }
    }
    assert pod_problem(pod) == f"cuda-validation: CrashLoopBackOff: {message}"


def test_pod_problem_of_a_restarted_validation_is_its_last_failure() -> None:
    from gpu_operator.statusview.table import pod_problem

    message = (
        "driver: the operator's driver container at /run/nvidia/validations/.driver-ctr-ready: waited 10s"
    )
    pod = {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "driver-validation",
                    "state": {"running": {}},
                    "restartCount": 1,
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
                },
            ],
            "conditions": [
                {"type": "Initialized", "status": "False", "message": "containers with incomplete status"}
            ],
        }
    }
    assert pod_problem(pod) == f"driver-validation: running again after exit 1: {message}"


def test_a_validator_still_waiting_is_named_before_the_kubelets_generic_condition() -> None:
    from gpu_operator.statusview.table import pod_problem

    # a real node without a driver: driver-validation waits (up to 15 min) before it fails once
    pod: dict[str, Any] = {
        "metadata": {"name": "nvidia-operator-validator-x"},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "driver-validation",
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                    "restartCount": 0,
                },
                {"name": "toolkit-validation", "state": {"waiting": {"reason": "PodInitializing"}}},
                {"name": "cuda-validation", "state": {"waiting": {"reason": "PodInitializing"}}},
            ],
            "containerStatuses": [
                {"name": "nvidia-operator-validator", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
            "conditions": [
                {
                    "type": "Initialized",
                    "status": "False",
                    "reason": "ContainersNotInitialized",
                    "message": "containers with incomplete status: [driver-validation toolkit-validation]",
                }
            ],
        },
    }
    problem = pod_problem(pod)
    assert problem == (
        "driver-validation: init container 1 of 3 still running, not passed yet (its log says what "
        "it waits for: kubectl logs <pod> -c driver-validation)"
    )
    # a container waiting for a reason of its own says it, message included
    pod["status"]["initContainerStatuses"][0]["state"] = {
        "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "licence" not found'}
    }
    assert pod_problem(pod) == 'driver-validation: CreateContainerConfigError: secret "licence" not found'
    # with no container saying more, the condition is still the reason
    pod["status"]["initContainerStatuses"] = []
    pod["status"]["containerStatuses"] = []
    assert pod_problem(pod).startswith("Initialized: containers with incomplete status")


def test_a_vm_passthrough_finding_is_a_problem_and_a_synced_list_is_not() -> None:
    nodes = [node("gpu-a")]
    ready = policy()
    ready["status"]["conditions"].append(
        {
            "type": "VMPassthrough",
            "status": "False",
            "reason": "HostDriverOnPassthrough",
            "message": "Node gpu-a: GPU 0000:0a:00.0",
        }
    )
    assert build_view(nodes, [], [], [ready]).problems == [
        "VM passthrough: HostDriverOnPassthrough: Node gpu-a: GPU 0000:0a:00.0"
    ]
    ready["status"]["conditions"][-1].update(status="True", reason="HostDevicesSynced")
    assert build_view(nodes, [], [], [ready]).problems == []


def test_a_gpucluster_is_the_summary_and_each_node_shows_its_stack() -> None:
    nodes = [
        node("gpu-a", dra_driver="true", dra_validator="true"),
        node("gpu-b", device_plugin="true"),
        node("gpu-c"),
    ]
    dss = [daemonset("nvidia-dra-driver-kubelet-plugin", "dra-driver")]
    view = build_view(
        nodes,
        dss,
        [pod("nvidia-dra-driver-kubelet-plugin", "gpu-a")],
        [],
        "gpu-operator",
        clusters=[policy("gpu-cluster")],
    )
    assert view.policy is not None and (view.policy.kind, view.policy.name) == ("GPUCluster", "gpu-cluster")
    assert {r.name: r.stack for r in view.rows} == {"gpu-a": "dra", "gpu-b": "device-plugin", "gpu-c": ""}
    console = Console(width=160, record=True)
    console.print(render_view(view))
    text = console.export_text()
    assert "GPUCluster gpu-cluster: ready" in text and "stack" in text


def test_a_gpucluster_beside_the_clusterpolicy_is_a_problem() -> None:
    view = build_view([node("gpu-a")], [], [], [policy()], clusters=[policy("gpu-cluster")])
    assert view.policy is not None and view.policy.kind == "ClusterPolicy"
    assert any(
        p.startswith("GPUCluster gpu-cluster exists beside ClusterPolicy cluster-policy")
        for p in view.problems
    )
