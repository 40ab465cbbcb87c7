"""The state NVIDIA's operator v26.7.0 left on a simulator (tests/fixtures/nvidia-v26.7.0, recorded
by tools/takeover/record.py), put back onto the test control plane as that operator wrote it:
the ClusterPolicy with its status, the objects it owns (created by a plain create, as NVIDIA's
operator does, under its field manager), and its labels and annotations on the test's nodes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource
from tests.support.waiting import wait_for

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvidia-v26.7.0"
NAMESPACE_TOKEN = "@NAMESPACE@"
OWNER_UID_TOKEN = "@UID@"
NVIDIA_FIELD_MANAGER = "gpu-operator"  # controller-runtime's default: the binary's name
# Every operand DaemonSet's selector in NVIDIA's v26.7.0 (its assets/*/0*_daemonset.yaml,
# spec.selector.matchLabels): ours render the same (tests/unit/render/test_nvidia_selectors.py).
PART_OF = "app.kubernetes.io/part-of"
NVIDIA_SELECTORS = {
    "gpu-feature-discovery": {"app": "gpu-feature-discovery", PART_OF: "nvidia-gpu"},
    "nvidia-cc-manager": {"name": "nvidia-cc-manager"},
    "nvidia-container-toolkit-daemonset": {"app": "nvidia-container-toolkit-daemonset"},
    "nvidia-dcgm-exporter": {"app": "nvidia-dcgm-exporter"},
    "nvidia-device-plugin-daemonset": {"app": "nvidia-device-plugin-daemonset"},
    "nvidia-driver-daemonset": {"app": "nvidia-driver-daemonset"},
    "nvidia-kata-sandbox-device-plugin-daemonset": {"app": "nvidia-kata-sandbox-device-plugin-daemonset"},
    "nvidia-mig-manager": {"app": "nvidia-mig-manager"},
    "nvidia-device-plugin-mps-control-daemon": {"app": "nvidia-device-plugin-mps-control-daemon"},
    "nvidia-node-status-exporter": {"app": "nvidia-node-status-exporter"},
    "nvidia-operator-validator": {"app": "nvidia-operator-validator", PART_OF: "gpu-operator"},
    "nvidia-sandbox-device-plugin-daemonset": {"app": "nvidia-sandbox-device-plugin-daemonset"},
    "nvidia-sandbox-validator": {"app": "nvidia-sandbox-validator", PART_OF: "gpu-operator"},
    "nvidia-vfio-manager": {"name": "nvidia-vfio-manager"},
    "nvidia-vgpu-device-manager": {"app": "nvidia-vgpu-device-manager"},
    "nvidia-vgpu-manager-daemonset": {"app": "nvidia-vgpu-manager-daemonset"},
}


def _replace(value: Any, tokens: dict[str, str]) -> Any:
    if isinstance(value, str):
        for token, real in tokens.items():
            value = value.replace(token, real)
        return value
    if isinstance(value, list):
        return [_replace(v, tokens) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, tokens) for k, v in value.items()}
    return value


def read(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURE / name).read_text()) if d]


@dataclass
class Loaded:
    policy_uid: str
    objects: list[dict[str, Any]]  # as created (namespace and owner uid filled in)
    nodes: dict[str, str] = field(default_factory=dict)  # recorded node name -> test node

    def named(self, kind: str) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o for o in self.objects if o["kind"] == kind}


def _create(kube: Client, obj: dict[str, Any], timeout: float = 90.0) -> None:
    """Create; an object of the same name still being garbage-collected after an earlier test is
    waited for."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kube.create(from_dict(obj), field_manager=NVIDIA_FIELD_MANAGER)
            return
        except ApiError as err:
            if err.status.code != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def load(
    kube: Client,
    namespace: str,
    nodes: list[str],
    spec: dict[str, Any] | None = None,
    labels: dict[str, dict[str, str]] | None = None,
) -> Loaded:
    """NVIDIA's state into `namespace`, its node labels onto `nodes` (in the recorded order).
    `spec`: values merged into the recorded ClusterPolicy's spec before it is created, as a
    user's chart values would have set them (the recorded objects are NVIDIA's defaults').
    `labels`: per test node, label values put over the recorded ones (the real node's deploy
    labels of the operands whose images it cannot run: tests/integration/test_takeover_real_node.py)."""
    tokens = {NAMESPACE_TOKEN: namespace}
    (policy,) = [d for d in read("policy.yaml") if d["kind"] == "ClusterPolicy"]
    policy = _replace(policy, tokens)
    policy["spec"] = _merged(policy["spec"], spec or {})
    uid = create_with_status(kube, ClusterPolicyResource, policy)
    tokens[f"{OWNER_UID_TOKEN}-ClusterPolicy-{policy['metadata']['name']}"] = uid
    objects = [_replace(o, tokens) for o in read("objects.yaml")]
    for obj in objects:
        _create(kube, obj)
    return Loaded(uid, objects, label_nodes(kube, recorded_nodes(), nodes, labels))


def create_with_status(kube: Client, resource: Any, body: dict[str, Any]) -> str:
    """`body` created as NVIDIA's operator's, then its recorded status written; returns its uid."""
    status = body.pop("status", None)
    created = kube.create(resource(**body), field_manager=NVIDIA_FIELD_MANAGER)
    if status:
        kube.patch(
            resource.Status,
            body["metadata"]["name"],
            {"status": status},
            patch_type=PatchType.MERGE,
            field_manager=NVIDIA_FIELD_MANAGER,
        )
    return str(created["metadata"]["uid"])


def label_nodes(
    kube: Client,
    records: list[dict[str, Any]],
    nodes: list[str],
    labels: dict[str, dict[str, str]] | None = None,
) -> dict[str, str]:
    """Each recorded node's labels and annotations onto a test node (in order), `labels` over
    them per test node; returns recorded name -> test node."""
    mapping = {}
    for record, node in zip(records, nodes, strict=False):
        mapping[record["name"]] = node
        meta = {
            "labels": {**record["labels"], **(labels or {}).get(node, {})},
            "annotations": record["annotations"],
        }
        kube.patch(
            Node, node, {"metadata": meta}, patch_type=PatchType.MERGE, field_manager=NVIDIA_FIELD_MANAGER
        )
    return mapping


def pods_by_owner(kube: Client, namespace: str) -> dict[str, dict[str, str]]:
    """DaemonSet name -> {pod uid: node} of its live (not terminating) pods."""
    out: dict[str, dict[str, str]] = {}
    for pod in kube.list(Pod, namespace=namespace):
        meta, spec = pod.metadata, pod.spec
        assert meta is not None and spec is not None
        if meta.deletionTimestamp:
            continue
        for ref in meta.ownerReferences or []:
            if ref.kind == "DaemonSet" and ref.controller:
                out.setdefault(ref.name, {})[str(meta.uid)] = str(spec.nodeName)
    return out


def not_rolled(
    kube: Client, namespace: str, before: dict[str, dict[str, str]], skip: str, short: dict[str, Any]
) -> dict[str, Any]:
    """The operands (but `skip`) whose pods of `before` still run, or which are `short` of pods:
    DaemonSet -> what is short, or the uids still running."""
    now = pods_by_owner(kube, namespace)
    return {
        n: short.get(n) or sorted(set(now.get(n, {})) & set(before[n]))
        for n in before
        if n != skip and (n in short or set(now.get(n, {})) & set(before[n]))
    }


def recorded_nodes() -> list[dict[str, Any]]:
    return sorted(read("nodes.yaml"), key=lambda r: r["name"])


def driver_pods_kept(kube: Client, namespace: str, driver: str, before: dict[str, str]) -> None:
    """Once the DaemonSet controller has seen our template on the `OnDelete` driver DaemonSet, no
    pod of it is ours and its pods are `before`'s (NVIDIA's, none restarted)."""

    def seen() -> Any:
        return kube.get(DaemonSet, driver, namespace=namespace)

    settled = wait_for(
        "the DaemonSet controller caught up with our template",
        seen,
        until=lambda d: d.status is not None and d.status.observedGeneration == d.metadata.generation,
        timeout=30,
    )
    assert settled.status.updatedNumberScheduled in (0, None), settled.status  # every pod NVIDIA's
    assert pods_by_owner(kube, namespace)[driver] == before
