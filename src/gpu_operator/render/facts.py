"""Cluster facts as plain data (nodes, runtime, versions, namespace, operator env): rendering does no I/O."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from gpu_operator.render.distributions import detect, toolkit_group
from gpu_operator.render.readlabels import ReadLabels, same_read_labels
from gpu_operator.render.result import RenderError
from gpu_operator.vocabulary import (
    CONTAINER,
    GPU_PRESENT,
    KERNEL_FULL,
    NFD_GPU_LABELS,
    OS_ID,
    OS_VERSION_ID,
    PASSTHROUGH_DEVICES_ANNOTATION,
    PROBE_FACTS_ANNOTATION,
    WORKLOAD_CONFIG,
    WORKLOAD_CONFIGS,
)

# Distributions whose OS tag uses the major version only (rhel9, not rhel9.4).
MAJOR_ONLY_OS = ("rhel", "rocky", "ol")
_RUNTIME_PREFIXES = {"docker://": "docker", "containerd://": "containerd", "cri-o://": "crio"}


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    runtime_version: str = ""
    kernel_version: str = ""
    kubelet_version: str = ""
    # the node probe's view of the host's runtime (`probe_runtime`): flavor, config, template, socket
    probe_runtime: Mapping[str, str] = field(default_factory=dict)
    mixed: bool = False  # a passthrough list (`passthrough_list`): some GPUs to VMs, the rest to containers

    def __post_init__(self) -> None:
        # the keys any code reads are noted, so that a render is reused while only others change
        object.__setattr__(self, "labels", ReadLabels(self.labels))

    def renders_like(self, other: NodeFacts) -> bool:
        """Equal but for labels no code has read (render/readlabels.py): every other field (a field
        added later included) compared whole."""
        return self is other or (
            all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.name != "labels")
            and same_read_labels(self.labels, other.labels)
        )

    @functools.cached_property
    def gpu(self) -> bool:
        # Cached: every render asks it of every node several times (facts never change once built).
        return self.labels.get(GPU_PRESENT) == "true"

    @property
    def os_tag(self) -> str:
        """`<ID><VERSION_ID>` from NFD os-release labels (e.g. ubuntu22.04, rhel9), or ""."""
        os_id = self.labels.get(OS_ID, "")
        version = self.labels.get(OS_VERSION_ID, "")
        if not os_id or not version:
            return ""
        if os_id in MAJOR_ONLY_OS:
            version = version.split(".")[0]
        return f"{os_id}{version}"

    @functools.cached_property
    def distribution(self) -> str:
        """Whose container runtime the node runs (render/distributions.py): the probe's host files
        first, then nodeInfo's runtime and kubelet versions."""
        return detect(self.runtime_version, self.kubelet_version, self.probe_runtime, self.labels)

    @functools.cached_property
    def toolkit_group(self) -> str:
        """Which container-toolkit DaemonSet serves the node (render/distributions.py); cached, as
        node facts never change once built and the labeller and renderer read it on every pass."""
        return toolkit_group(self.runtime_version, self.kubelet_version, self.probe_runtime, self.labels)

    @property
    def kernel(self) -> str:
        return self.labels.get(KERNEL_FULL, "") or self.kernel_version

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeFacts:
        """From a Node object (a dict as the API returns it)."""
        meta = node.get("metadata") or {}
        info = (node.get("status") or {}).get("nodeInfo") or {}
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            runtime_version=str(info.get("containerRuntimeVersion", "")),
            kernel_version=str(info.get("kernelVersion", "")),
            kubelet_version=str(info.get("kubeletVersion", "")),
            probe_runtime=probe_runtime(meta.get("annotations") or {}),
            mixed=passthrough_list(meta.get("annotations") or {}) is not None,
        )


def probe_runtime(annotations: Mapping[str, str]) -> dict[str, str]:
    """The `runtime` the node probe publishes in its facts annotation (node/cluster/publish.py), as text
    fields; empty where the probe has not run or found no runtime."""
    try:
        facts = json.loads(annotations.get(PROBE_FACTS_ANNOTATION) or "{}")
    except ValueError:
        return {}
    runtime = facts.get("runtime") if isinstance(facts, dict) else None
    if not isinstance(runtime, dict):
        return {}
    return {str(k): str(v) for k, v in runtime.items() if isinstance(v, str) and v}


def runtime_of(nodes: list[NodeFacts], openshift: bool) -> str:
    """The cluster's container runtime: crio on OpenShift; containerd wins over the rest."""
    if openshift:
        return "crio"
    found = ""
    for node in nodes:
        if not node.gpu:
            continue
        for prefix, runtime in _RUNTIME_PREFIXES.items():
            if node.runtime_version.startswith(prefix):
                if runtime == "containerd":
                    return "containerd"
                found = runtime
    return found or "containerd"


def has_nfd_gpu_labels(labels: Mapping[str, str]) -> bool:
    return any(labels.get(key) == "true" for key in NFD_GPU_LABELS)


# The operator's env vars the renderer reads: image fallbacks (DRIVER_IMAGE, CUDA_VALIDATOR_IMAGE, ...).
IMAGE_ENV_SUFFIX = "_IMAGE"


def operator_env(environ: Mapping[str, str], defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `ClusterFacts.operator_env` of a process environment: its non-empty *_IMAGE variables,
    over `defaults` (offline rendering passes the chart's images; the operator passes none, its
    Deployment sets them). The one rule for the operator and `gpu-operator render`."""
    env = dict(defaults or {})
    env.update({k: v for k, v in environ.items() if k.endswith(IMAGE_ENV_SUFFIX) and v})
    return env


def workload_config(labels: Mapping[str, str], sandbox_enabled: bool, default_workload: str) -> str:
    """A node's workload config (upstream's getWorkloadConfig): container unless sandbox workloads are on;
    then its `nvidia.com/gpu.workload.config` label if valid, else the policy's default, else container."""
    if not sandbox_enabled:
        return CONTAINER
    if labels.get(WORKLOAD_CONFIG) in WORKLOAD_CONFIGS:
        return labels[WORKLOAD_CONFIG]
    return default_workload if default_workload in WORKLOAD_CONFIGS else CONTAINER


def passthrough_list(annotations: Mapping[str, str]) -> list[str] | None:
    """A mixed node's passthrough GPUs (annotation `nvidia.com/gpu.passthrough.devices`), as written and
    lowercased, a missing domain read as 0000; None when the node has no such list (not mixed)."""
    words = [
        w.strip().lower()
        for w in annotations.get(PASSTHROUGH_DEVICES_ANNOTATION, "").replace(",", " ").split()
    ]
    if not words:
        return None
    return sorted({w if w.count(":") == 2 else f"0000:{w}" for w in words})


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class ClusterFacts:
    """Everything the renderer knows about the cluster; build it with :meth:`of` (node facts) or
    :meth:`from_nodes` (Node objects)."""

    nodes: tuple[NodeFacts, ...]
    namespace: str = "gpu-operator"
    k8s_version: str = "1.37.0"
    openshift: bool = False
    openshift_version: str = ""
    runtime: str = "containerd"
    operator_env: Mapping[str, str] = field(default_factory=dict)
    servicemonitor_crd: bool = True
    # keys of ConfigMaps the policy references (repo/cert/kernel-module configs), read by the operator
    configmap_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the data of driver.kernelModuleConfig's ConfigMap, which VM guests' own ConfigMap merges (guestnvlink.py)
    configmap_data: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # a hash of the content of the devicePlugin.config ConfigMap ("": not read, or no such ConfigMap)
    plugin_config_hash: str = ""

    @classmethod
    def from_nodes(cls, node_dicts: list[dict[str, Any]], **kwargs: Any) -> ClusterFacts:
        """From Node objects (dicts as the API returns them); keywords as :meth:`of`."""
        return cls.of([NodeFacts.of(node) for node in node_dicts], **kwargs)

    @classmethod
    def of(
        cls,
        node_facts: Iterable[NodeFacts],
        *,
        namespace: str = "gpu-operator",
        k8s_version: str = "1.37.0",
        openshift: bool = False,
        openshift_version: str = "",
        operator_env: Mapping[str, str] | None = None,
        servicemonitor_crd: bool = True,
        configmap_keys: Mapping[str, tuple[str, ...]] | None = None,
        configmap_data: Mapping[str, Mapping[str, str]] | None = None,
        plugin_config_hash: str = "",
    ) -> ClusterFacts:
        if not _VERSION.match(k8s_version):
            raise RenderError("k8s_version", f"{k8s_version!r} is not a version: use e.g. 1.37.2")
        nodes = tuple(node_facts)
        return cls(
            nodes=nodes,
            namespace=namespace,
            k8s_version=k8s_version,
            openshift=openshift,
            openshift_version=openshift_version,
            runtime=runtime_of(list(nodes), openshift),
            operator_env=dict(operator_env or {}),
            servicemonitor_crd=servicemonitor_crd,
            configmap_keys=dict(configmap_keys or {}),
            configmap_data=dict(configmap_data or {}),
            plugin_config_hash=plugin_config_hash,
        )

    def renders_like(self, other: ClusterFacts) -> bool:
        """Whether a render of `other` is one of these facts (the renderer is pure): every field
        equal, and the nodes equal but for labels no code has read (render/readlabels.py)."""
        if self is other:
            return True
        if len(self.nodes) != len(other.nodes) or any(
            getattr(self, f.name) != getattr(other, f.name) for f in fields(self) if f.name != "nodes"
        ):
            return False
        return all(a.renders_like(b) for a, b in zip(self.nodes, other.nodes, strict=True))

    @functools.cached_property
    def gpu_nodes(self) -> tuple[NodeFacts, ...]:
        # Cached: the states ask for it ~20 times per render, and facts never change once built.
        return tuple(node for node in self.nodes if node.gpu)

    @property
    def has_gpu_nodes(self) -> bool:
        return bool(self.gpu_nodes)

    @property
    def os_tag(self) -> str:
        """The OS tag of the first GPU node (the ClusterPolicy path assumes one OS)."""
        for node in self.gpu_nodes:
            if node.os_tag:
                return node.os_tag
        return ""

    @property
    def os_id(self) -> str:
        for node in self.gpu_nodes:
            if node.labels.get(OS_ID):
                return node.labels[OS_ID]
        return ""

    @property
    def kernels(self) -> tuple[str, ...]:
        """Distinct full kernel versions of GPU nodes, sorted (one precompiled DaemonSet each)."""
        return tuple(sorted({node.kernel for node in self.gpu_nodes if node.kernel}))

    def k8s_minor(self) -> tuple[int, int]:
        match = _VERSION.match(self.k8s_version)
        assert match is not None  # checked in from_nodes
        return int(match[1]), int(match[2])
