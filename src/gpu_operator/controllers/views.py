"""The views of watched objects the read model holds (built by kopf index handlers and the Node
reflector): only the few facts a unit reads of each, never a cache of whole bodies."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

import pydantic

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.gpucluster import GPUCluster
from gpu_operator.api.healthpolicy import OUR_TAINT_PREFIXES
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.render.distributions import MICROK8S_LABEL
from gpu_operator.render.facts import NodeFacts, has_nfd_gpu_labels, passthrough_list, probe_runtime
from gpu_operator.vocabulary import (
    CONTROLLER_REVISION_HASH,
    GFD_LABELS_ANNOTATION,
    GPU_PRESENT,
    HASH_ANNOTATION,
    HEALTH_CONDITION,
    HEALTH_TAINT,
    KERNEL_FULL,
    MIG_ANNOTATION_PREFIX,
    MIG_CONDITION,
    NFD_DEVICE_LABEL_PREFIX,
    NFD_GPU_LABELS,
    NFD_HYPERVISOR,
    NFD_PREFIX,
    NVIDIA,
    PASSTHROUGH_DEVICES_ANNOTATION,
    PROBE_FACTS_ANNOTATION,
    STATE_LABEL,
    UPGRADE_ANNOTATION_PREFIX,
    UPGRADE_ENABLED_ANNOTATION,
)

UPGRADE_ANNOTATIONS = (UPGRADE_ENABLED_ANNOTATION,)
# What the node labeller and the KubeVirt sync read: the upgrade switch, a mixed node's passthrough
# list, the probe's published GPU facts, the GFD labels the labeller wrote (controllers/units/labels/gfdlabels.py).
KEPT_ANNOTATIONS = (
    *UPGRADE_ANNOTATIONS,
    PASSTHROUGH_DEVICES_ANNOTATION,
    PROBE_FACTS_ANNOTATION,
    GFD_LABELS_ANNOTATION,
)
M = TypeVar("M", bound=pydantic.BaseModel)
# GPU health: the agent's report (nvidia.com/gpu-health.report) and the remediation state
# machine's annotations (controllers/units/health/machine.py) share this prefix.
HEALTH_ANNOTATION_PREFIX = "nvidia.com/gpu-health."


def kept_annotation(key: str) -> bool:
    """One of KEPT_ANNOTATIONS, or one the driver upgrade, the GPU health state machine or the MIG
    unit reads and writes."""
    return key in KEPT_ANNOTATIONS or key.startswith(
        (UPGRADE_ANNOTATION_PREFIX, HEALTH_ANNOTATION_PREFIX, MIG_ANNOTATION_PREFIX)
    )


def is_relevant_label(key: str) -> bool:
    """The label keys the operator keeps in memory per node (everything else is dropped)."""
    return (
        key.startswith(f"{NVIDIA}/")
        or key in NFD_GPU_LABELS
        or key.startswith(NFD_PREFIX + "system-os_release.")
        or key.startswith(NFD_DEVICE_LABEL_PREFIX)
        # the kernel; the runtime's distribution (render/distributions.py); a VM guest (guestnvlink.py)
        or key in (KERNEL_FULL, MICROK8S_LABEL, NFD_HYPERVISOR)
    )


def kept_taint(key: str) -> bool:
    """A taint the GPU health signals read: the quarantine taint, startup taints (api/healthpolicy.py)."""
    return key == HEALTH_TAINT or key.startswith(OUR_TAINT_PREFIXES)


Taints = tuple[tuple[str, str, str], ...]  # (key, effect, value), sorted
GPUCondition = tuple[str, str, str]  # NvidiaGPUReady's (status, reason, message)


def kept_taints(taints: Any) -> Taints:
    """The kept taints of a Node's spec.taints (dicts, or objects with key/effect/value)."""
    out = []
    for t in taints or ():
        key, effect, value = (
            (t.get("key"), t.get("effect"), t.get("value"))
            if isinstance(t, dict)
            else (t.key, t.effect, t.value)
        )
        if key and kept_taint(key):
            out.append((sys.intern(key), sys.intern(effect or ""), value or ""))
    return tuple(sorted(out))


def gpu_condition(conditions: Any, kind: str = HEALTH_CONDITION) -> GPUCondition | None:
    """NvidiaGPUReady's (or the condition `kind`'s) (status, reason, message) among a Node's
    conditions (dicts or objects)."""
    for c in conditions or ():
        fields = (
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
            if isinstance(c, dict)
            else (c.type, c.status, c.reason, c.message)
        )
        if fields[0] == kind:
            return (fields[1] or "", fields[2] or "", fields[3] or "")
    return None


def mig_condition(conditions: Any) -> GPUCondition | None:
    """NvidiaMIGReady's (status, reason, message), written by the MIG unit."""
    return gpu_condition(conditions, MIG_CONDITION)


@dataclass(frozen=True)
class NodeView:
    """The few facts of a Node the operator needs: relevant labels, one annotation, nodeInfo."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    runtime: str
    kernel: str
    kubelet: str = ""  # nodeInfo.kubeletVersion (a distribution's suffix: +k3s1, +rke2r1, +k0s)
    # Every label, for NVIDIADriver nodeSelectors (which may use any key); `labels` above is the
    # part the renderer and the labeller read.
    selectable: dict[str, str] = field(default_factory=dict)
    # What the driver upgrade controller reads besides labels: cordoned, Ready, and its own
    # annotations (kept in `annotations` too, see `kept_annotation`).
    unschedulable: bool = False
    ready: bool = False
    # What the GPU health signals read besides labels and annotations: our taints (`kept_taint`)
    # and the NvidiaGPUReady condition as the node carries it.
    taints: Taints = ()
    gpu_condition: GPUCondition | None = None
    mig_condition: GPUCondition | None = None  # NvidiaMIGReady as the node carries it (the MIG unit's)
    # When the Node watch delivered this view (monotonic clock; 0 when not from the watch): how
    # long a label change waited is measured from here. Not part of what the view says.
    seen: float = field(default=0.0, compare=False)

    @classmethod
    def of(cls, body: Any) -> NodeView:
        meta = body.get("metadata", {})
        info = (body.get("status") or {}).get("nodeInfo") or {}
        return cls.of_parts(
            meta["name"],
            meta.get("labels") or {},
            meta.get("annotations") or {},
            runtime=info.get("containerRuntimeVersion", ""),
            kernel=info.get("kernelVersion", ""),
            kubelet=info.get("kubeletVersion", ""),
            unschedulable=bool((body.get("spec") or {}).get("unschedulable")),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (body.get("status") or {}).get("conditions") or []
            ),
            taints=kept_taints((body.get("spec") or {}).get("taints")),
            gpu_condition=gpu_condition((body.get("status") or {}).get("conditions")),
            mig_condition=mig_condition((body.get("status") or {}).get("conditions")),
        )

    @classmethod
    def of_parts(
        cls,
        name: str,
        labels: dict[str, str],
        annotations: dict[str, str],
        *,
        runtime: str = "",
        kernel: str = "",
        kubelet: str = "",
        unschedulable: bool = False,
        ready: bool = False,
        seen: float = 0.0,
        taints: Taints = (),
        gpu_condition: GPUCondition | None = None,
        mig_condition: GPUCondition | None = None,
    ) -> NodeView:
        """From a Node's fields (a body, or the Node watch's decoded node): only the labels and
        annotations the operator reads are kept in `labels`/`annotations`."""
        return cls(
            name=name,
            labels={k: v for k, v in labels.items() if is_relevant_label(k)},
            annotations={k: v for k, v in annotations.items() if kept_annotation(k)},
            runtime=runtime,
            kernel=kernel,
            kubelet=kubelet,
            selectable=dict(labels),
            unschedulable=unschedulable,
            ready=ready,
            seen=seen,
            taints=taints,
            gpu_condition=gpu_condition,
            mig_condition=mig_condition,
        )

    # Cached (a view is replaced, not changed): each ClusterPolicy pass asks them of every node.
    @functools.cached_property
    def has_nfd(self) -> bool:
        return any(k.startswith(NFD_PREFIX) for k in self.labels)

    @functools.cached_property
    def gpu_present(self) -> bool:
        return self.labels.get(GPU_PRESENT) == "true"

    @functools.cached_property
    def nfd_gpu(self) -> bool:
        """NFD labelled a GPU on the node (its PCI vendor labels), whether or not ours say gpu.present."""
        return has_nfd_gpu_labels(self.labels)

    @functools.cached_property
    def facts(self) -> NodeFacts:
        """The renderer's facts of this node, built once per view: a view is replaced, not
        changed, when the node changes, and every reconcile reads the facts of every node."""
        return NodeFacts(
            self.name,
            self.labels,
            runtime_version=self.runtime,
            kernel_version=self.kernel,
            kubelet_version=self.kubelet,
            probe_runtime=probe_runtime(self.annotations),
            mixed=passthrough_list(self.annotations) is not None,
        )


@dataclass(frozen=True)
class CRView(Generic[M]):
    """One of our custom resources as the caches keep it; `parsed` is its body validated by the
    kind's api model, once per object version (a view is replaced, not changed, when its object
    changes), shared by every unit that reads it. One subclass per kind."""

    name: str
    uid: str
    generation: int
    created: str
    body: dict[str, Any]

    MODEL: ClassVar[type[pydantic.BaseModel]]

    @classmethod
    def of(cls, body: Any) -> Self:
        meta = body.get("metadata", {})
        plain = json.loads(json.dumps(dict(body)))
        return cls(
            meta["name"],
            meta["uid"],
            int(meta.get("generation", 0)),
            meta.get("creationTimestamp", ""),
            plain,
        )

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def deleting(self) -> bool:
        return bool(self.body.get("metadata", {}).get("deletionTimestamp"))

    @functools.cached_property
    def parsed(self) -> Parsed[M]:
        """This view's body as its kind's model, or the model's refusal."""
        return cast("Parsed[M]", Parsed.of(self.MODEL, self.body))


@dataclass(frozen=True)
class ClusterPolicyView(CRView[ClusterPolicy]):
    MODEL = ClusterPolicy


@dataclass(frozen=True)
class NVIDIADriverView(CRView[NVIDIADriver]):
    MODEL = NVIDIADriver


@dataclass(frozen=True)
class GPUClusterView(CRView[GPUCluster]):
    MODEL = GPUCluster


@dataclass(frozen=True)
class Parsed(Generic[M]):
    """A body validated by an api model: the model, or the ValidationError that names the field."""

    model: M | None
    error: pydantic.ValidationError | None = None

    @classmethod
    def of(cls, model: type[M], body: Any) -> Parsed[M]:
        try:
            return cls(model.model_validate(body))
        except pydantic.ValidationError as err:
            return cls(None, err)

    def valid(self) -> M:
        """The model; raises the stored ValidationError for a body the model refused."""
        if self.error is not None:
            raise self.error
        assert self.model is not None
        return self.model


@dataclass(frozen=True)
class OwnedView:
    """An object carrying our managed-by label: who owns it, which hash it was applied with and,
    for DaemonSets, what readiness needs."""

    api_version: str
    kind: str
    name: str
    namespace: str | None
    uid: str
    owner_uids: tuple[str, ...]
    applied_hash: str
    state: str
    readiness: dict[str, Any] | None = None
    # a DaemonSet whose pods hold ResourceClaims (deleted before the DRA kubelet plugin goes)
    claims: bool = False
    deleting: bool = False  # has a deletionTimestamp (e.g. waiting for its pods: foreground deletion)

    @classmethod
    def of(cls, body: Any) -> OwnedView:
        meta = body.get("metadata", {})
        kind = body.get("kind", "")
        readiness = None
        if kind in ("DaemonSet", "Deployment"):
            # Exactly what status.daemonset_ready and status.deployment_ready read.
            readiness = {
                "metadata": {"generation": meta.get("generation", 0)},
                "status": dict(body.get("status") or {}),
            }
        pod = (
            (((body.get("spec") or {}).get("template") or {}).get("spec") or {})
            if kind == "DaemonSet"
            else {}
        )
        return cls(
            api_version=body.get("apiVersion", ""),
            kind=kind,
            name=meta["name"],
            namespace=meta.get("namespace"),
            uid=meta.get("uid", ""),
            owner_uids=tuple(
                ref.get("uid", "") for ref in meta.get("ownerReferences") or [] if ref.get("controller")
            ),
            applied_hash=(meta.get("annotations") or {}).get(HASH_ANNOTATION, ""),
            state=(meta.get("labels") or {}).get(STATE_LABEL, ""),
            readiness=readiness,
            claims=bool(pod.get("resourceClaims")),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def key(self) -> tuple[str, str, str | None, str]:
        return object_key(self.api_version, self.kind, self.namespace, self.name)


DIGEST_ENV = "DRIVER_CONFIG_DIGEST"


def config_digest(spec: Any) -> str:
    """The driver configuration digest a pod spec (or a DaemonSet's pod template) carries in its
    DRIVER_CONFIG_DIGEST env ('' when none does)."""
    for container in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        for env in container.get("env") or []:
            if env.get("name") == DIGEST_ENV:
                return str(env.get("value", ""))
    return ""


def pod_ready(pod: Any) -> bool:
    """Running with every container ready: upstream's test for driver and validator pods alike. Not
    the pod's Ready condition: the node lifecycle controller sets that False on every pod of a node
    that missed its heartbeats, and only a kubelet sets it back (containers ready all along)."""
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    return status.get("phase") == "Running" and bool(statuses) and all(s.get("ready") for s in statuses)


@dataclass(frozen=True)
class DriverPodView:
    """A driver pod (label app.kubernetes.io/component=nvidia-driver) as the watch shows it: where
    it runs, whether it runs, whether a controller still owns it, and the facts the driver upgrade
    state machine reads (its DaemonSet, revision, readiness, restarts, configuration digest)."""

    name: str
    node: str
    running: bool
    orphaned: bool
    namespace: str = ""
    daemonset: str = ""  # uid of the DaemonSet that controls it ('' when none does)
    revision: str | None = None  # its controller-revision-hash label
    ready: bool = False  # Running, and every container ready
    restarts: int = 0
    digest: str = ""
    deleting: bool = False

    @classmethod
    def of(cls, body: Any) -> DriverPodView:
        meta = body.get("metadata", {})
        spec, status = body.get("spec") or {}, body.get("status") or {}
        owners = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
        statuses = status.get("containerStatuses") or []
        revision = (meta.get("labels") or {}).get(CONTROLLER_REVISION_HASH)
        # namespace, DaemonSet uid, revision and digest repeat on every node's pod: one string each
        return cls(
            name=meta["name"],
            node=spec.get("nodeName") or "",
            running=status.get("phase") == "Running",
            orphaned=not owners,
            namespace=sys.intern(meta.get("namespace") or ""),
            daemonset=sys.intern(
                next((r.get("uid", "") for r in owners if r.get("kind") == "DaemonSet"), "")
            ),
            revision=sys.intern(revision) if revision is not None else None,
            ready=pod_ready(body),
            restarts=max((int(s.get("restartCount", 0)) for s in statuses), default=0),
            digest=sys.intern(config_digest(spec)),
            deleting=bool(meta.get("deletionTimestamp")),
        )


OwnedKey = tuple[str, str, str | None, str]  # an owned object's (API group, kind, namespace, name)


def object_key(api_version: str, kind: str, namespace: str | None, name: str) -> OwnedKey:
    return (api_version.split("/")[0] if "/" in api_version else "", kind, namespace, name)


def desired_hash(obj: dict[str, Any]) -> str:
    """A stable hash of what we apply; equal hash on the live object means nothing to do."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def first(store: Any) -> Any:
    """The single value of a kopf index store (our keys are unique per object)."""
    for value in store:
        return value
    return None
