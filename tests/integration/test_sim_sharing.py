"""GPU sharing end to end on a kwok node, on the real control plane: the operator (real process)
deploys the device plugin and GFD with the policy's devicePlugin.config ConfigMap; the stand-ins
(sim/standins/kubeletdp.py, sim/standins/gfd.py through sim/standins/pluginconfig.py) read it as NVIDIA's config-manager and
plugin do. Time-slicing with 4 replicas gives 4 x the GPUs and GFD's sharing labels; the node's
`nvidia.com/device-plugin.config` label pointed at another key changes the advertised resources
with no pod deleted (the config-manager sidecar's SIGHUP)."""

from __future__ import annotations

from collections.abc import Callable

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from gpu_operator.kube.resources import FIELD_MANAGER
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import DEVICE_PLUGIN_CONFIG
from tests.support.waiting import wait_for

GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
CONFIGS = {
    "slice-4": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    "slice-2-shared": (
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 2\n"
    ),
}


def test_time_slicing_replicas_and_a_label_change_reach_the_node_without_a_restart(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    kube.create(
        ConfigMap(metadata=ObjectMeta(name="time-slicing", namespace=operator_namespace), data=CONFIGS)
    )
    node = fake_nodes("dgx-h100:1")[0]
    operator = start_operator()
    cluster_policies({"devicePlugin": {"config": {"name": "time-slicing", "default": "slice-4"}}})

    def state() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        found = kube.get(Node, node)
        status = found.status
        return (
            dict(found.metadata.labels or {}) if found.metadata else {},
            {k: str(v) for k, v in ((status.capacity if status else None) or {}).items()},
            {k: str(v) for k, v in ((status.allocatable if status else None) or {}).items()},
        )

    labels, capacity, allocatable = wait_for(
        "8 GPUs x 4 replicas and GFD's sharing labels",
        state,
        timeout=180,
        context=operator.log_text,
        until=lambda s: s[1].get(GPU) == "32" and s[0].get(f"{GPU}.replicas") == "4",
    )
    assert allocatable[GPU] == "32"
    assert labels[f"{GPU}.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert labels[f"{GPU}.sharing-strategy"] == "time-slicing" and labels[f"{GPU}.count"] == "8"

    def pods() -> set[str]:
        return {
            str(p.metadata.uid)
            for p in kube.list(Pod, namespace=operator_namespace, fields={"spec.nodeName": node})
            if p.metadata
            and (p.metadata.labels or {}).get("app")
            in ("nvidia-device-plugin-daemonset", "gpu-feature-discovery")
        }

    before = pods()
    assert len(before) == 2, before

    kube.patch(Node, node, {"metadata": {"labels": {DEVICE_PLUGIN_CONFIG: "slice-2-shared"}}})
    labels, capacity, allocatable = wait_for(
        "the renamed resource with 2 replicas",
        state,
        timeout=120,
        context=operator.log_text,
        until=lambda s: s[1].get(SHARED) == "16" and s[0].get(f"{GPU}.replicas") == "2",
    )
    assert allocatable[SHARED] == "16" and allocatable[GPU] == "0"  # the old endpoint stopped
    assert labels[f"{GPU}.product"] == "NVIDIA-H100-80GB-HBM3"  # renamed: no -SHARED
    assert pods() == before  # nobody restarted a pod


def test_an_edit_of_the_configmaps_key_in_use_reaches_the_node_without_a_manual_restart(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    """NVIDIA/gpu-operator#1144: config-manager re-links the file only on a label change; the operator
    watches the named ConfigMap and rolls the plugins' pods with the content's hash on their template."""
    kube.create(
        ConfigMap(
            metadata=ObjectMeta(name="time-slicing", namespace=operator_namespace),
            data={"slice-4": CONFIGS["slice-4"]},
        )
    )
    node = fake_nodes("dgx-h100:1")[0]
    operator = start_operator()
    cluster_policies({"devicePlugin": {"config": {"name": "time-slicing", "default": "slice-4"}}})

    def capacity() -> str | None:
        status = kube.get(Node, node).status
        return str(((status.capacity if status else None) or {}).get(GPU))

    wait_for(
        "8 GPUs x 4 replicas", capacity, timeout=180, context=operator.log_text, until=lambda c: c == "32"
    )
    kube.patch(
        ConfigMap,
        "time-slicing",
        {"data": {"slice-4": CONFIGS["slice-4"].replace("replicas: 4", "replicas: 3")}},
        namespace=operator_namespace,
    )
    wait_for(
        "8 GPUs x 3 replicas once the edit reached the plugin",
        capacity,
        timeout=120,
        context=operator.log_text,
        until=lambda c: c == "24",
    )
    after = kube.get(ConfigMap, "time-slicing", namespace=operator_namespace)
    # the operator only read the user's ConfigMap: no field of it is the operator's
    managers = {m.manager for m in (after.metadata.managedFields if after.metadata else None) or []}
    assert FIELD_MANAGER not in managers, managers
    assert after.data == {"slice-4": CONFIGS["slice-4"].replace("replicas: 4", "replicas: 3")}
