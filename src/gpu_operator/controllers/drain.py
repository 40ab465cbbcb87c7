"""The one drain both controllers that empty a node use: driver upgrades (controllers/units/upgrade/controller.py and
its state machine, controllers/units/upgrade/state.py: GPU pod deletion and the drain) and GPU health
remediation (controllers/units/health/executor.py and controllers/units/health/machine.py). Three steps, the same
for both:

- which pods are on the node and what a drain knows of them (`pods_on`, `pod_facts`: GPU holders
  by controllers/gpuholders.py's rule, the caller's selectors, DaemonSet and static pods, the
  PodDisruptionBudget that refused the last eviction);
- the pure decision for the pods the caller chose (`decide`): none left -> done; a pod that only
  force or deleteEmptyDir may remove -> failed; first pass -> record the start and evict all;
  past the timeout -> failed, naming the PodDisruptionBudgets that refused or the pods left;
  else evict again those not terminating;
- the evictions (`evict`): the Eviction API, which honours PodDisruptionBudgets; a refusal is
  remembered per pod (`EvictionRefusals`) and read back into the next pass's facts.

The callers choose the pods (each has its own rules) and keep the start time where their machine
keeps its memory (an annotation on the Node)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.controllers.gpuholders import ClaimKey, RuntimeAccess, claim_keys, holds_gpu
from gpu_operator.kube.client import Kube
from gpu_operator.vocabulary import CONTROLLER_REVISION_HASH, UPGRADE_DRAIN_SKIP_POD_LABEL

log = logging.getLogger("gpu_operator.drain")

Claims = Mapping[ClaimKey, Mapping[str, Any]]
EvictionRefusals = dict[
    tuple[str, str], str
]  # (namespace, pod) -> "namespace/pdb" that refused its last eviction

DONE, WAIT, FAILED = "done", "wait", "failed"


@dataclass(frozen=True)
class PodFacts:
    """A pod on a node being emptied, as the decisions need it."""

    name: str
    namespace: str
    phase: str = "Running"
    gpu: bool = False  # holds GPUs of the node (controllers/gpuholders.py)
    daemonset: bool = False  # made by a DaemonSet, also orphaned (drain ignores these)
    mirror: bool = False  # static pod
    controlled: bool = True  # has a controller owner (else only removed with force)
    empty_dir: bool = False  # uses emptyDir (else only removed with deleteEmptyDir)
    drain_skip: bool = False  # nvidia.com/gpu-driver-upgrade-drain.skip=true
    wait_match: bool = False  # matches waitForCompletion.podSelector
    drain_match: bool = True  # matches drain.podSelector
    terminating: bool = False
    blocked_by: str = ""  # the PodDisruptionBudget that refused its last eviction


async def claims_of(kube: Kube, pods: Iterable[Mapping[str, Any]]) -> Claims | None:
    """The ResourceClaims the pods name, one list per namespace that holds one (no read when no pod
    names a claim); None when they cannot be read (the apiserver serves no ResourceClaim version we
    read, or refused): then every claim a pod names counts, as NVIDIA's operator counts a claim it
    cannot read (an eviction too many is recoverable, a driver unloaded under a GPU pod is not)."""
    found: dict[ClaimKey, Mapping[str, Any]] = {}
    for namespace in sorted({ns for pod in pods for ns, _ in claim_keys(pod)}):
        try:
            items = await kube.list_resource_claims(namespace)
        except Exception as err:  # counted as GPU claims; the next pass reads again
            log.warning(
                "ResourceClaims in %s not readable (%s): the pods naming one count as GPU pods",
                namespace,
                err,
            )
            return None
        if items is None:
            return None
        found.update(((namespace, c["metadata"]["name"]), c) for c in items)
    return found


# Labels the DaemonSet controller puts on every pod it makes (pod-template-generation is its own;
# controller-revision-hash it shares with StatefulSets); they stay when the pod is orphaned.
DAEMONSET_POD_LABELS = (CONTROLLER_REVISION_HASH, "pod-template-generation")


def made_by_daemonset(
    meta: Mapping[str, Any], controller: Mapping[str, Any] | None, operands: str | None = None
) -> bool:
    """Controlled by a DaemonSet, or made by one and orphaned in the operands' namespace
    `operands`: a DaemonSet deleted leaving its pods (the operator does so when a selector changes,
    controllers/apply.py) until the DaemonSet created again adopts them. Such a pod is no workload:
    taking it for one, a driver upgrade's GPU pod deletion refused it as uncontrolled and failed the
    node during a take-over. Only there: anyone who may create pods can put those labels on a bare
    pod, and one elsewhere taken for a DaemonSet's would be left holding GPUs under a driver restart."""
    if controller is not None:
        return controller.get("kind") == "DaemonSet"
    labels = meta.get("labels") or {}
    orphaned_operand = operands is not None and meta.get("namespace") == operands
    return orphaned_operand and all(key in labels for key in DAEMONSET_POD_LABELS)


def pod_facts(
    pod: Mapping[str, Any],
    wait_names: set[str],
    drain_names: set[str] | None,
    blocked: Mapping[tuple[str, str], str],
    *,
    access: RuntimeAccess,
    claims: Claims | None,
    operands: str | None = None,
) -> PodFacts:
    """One pod's facts; `wait_names`/`drain_names`: the names its node's pods matching the
    waitForCompletion/drain selector have (`drain_names` None: no drain selector, every pod matches);
    `operands`: the operator's namespace, where an orphaned DaemonSet pod is an operand's."""
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), None)
    name, ns = meta.get("name", ""), meta.get("namespace", "")
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return PodFacts(
        name,
        ns,
        phase=(pod.get("status") or {}).get("phase", ""),
        gpu=holds_gpu(pod, access, claims),
        daemonset=made_by_daemonset(meta, controller, operands),
        mirror="kubernetes.io/config.mirror" in (meta.get("annotations") or {}),
        controlled=controller is not None,
        empty_dir=any("emptyDir" in v for v in volumes),
        drain_skip=(meta.get("labels") or {}).get(UPGRADE_DRAIN_SKIP_POD_LABEL) == "true",
        wait_match=name in wait_names,
        drain_match=drain_names is None or name in drain_names,
        terminating=bool(meta.get("deletionTimestamp")),
        blocked_by=blocked.get((ns, name), ""),
    )


async def pods_on(
    kube: Kube,
    node: str,
    blocked: Mapping[tuple[str, str], str],
    *,
    access: RuntimeAccess,
    wait_selector: str = "",
    drain_selector: str = "",
    operands: str | None = None,
) -> tuple[PodFacts, ...]:
    """The facts of every pod on `node`: one list of the node's pods, one more per selector given
    (the pods matching it, by namespace and name), and the ResourceClaims they name (claims_of)."""
    on_node = f"spec.nodeName={node}"
    pods = await kube.list_pods(fields=on_node)
    wait = await _matching(kube, on_node, wait_selector) if wait_selector else set()
    drain = await _matching(kube, on_node, drain_selector) if drain_selector else None
    claims = await claims_of(kube, pods)
    facts = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        facts.append(
            pod_facts(
                pod,
                {key[1]} if key in wait else set(),
                None if drain is None else {key[1]} if key in drain else set(),
                blocked,
                access=access,
                claims=claims,
                operands=operands,
            )
        )
    return tuple(facts)


async def _matching(kube: Kube, on_node: str, selector: str) -> set[tuple[str, str]]:
    return {
        ((p.get("metadata") or {}).get("namespace", ""), p["metadata"]["name"])
        for p in await kube.list_pods(fields=on_node, labels=selector)
    }


def started_at(text: str | None) -> float | None:
    """A start time as kept in an annotation (epoch seconds); None when absent or unreadable."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class DrainDecision:
    """The next drain step: `outcome` done | wait | failed (`reason` says why); `start` the start
    time to record (the first pass), `evict` the pods to evict now, `message` for the log/event."""

    outcome: str
    reason: str = ""
    start: str | None = None
    evict: tuple[PodFacts, ...] = ()
    message: str = ""


def blockers(pods: Sequence[PodFacts], force: bool, empty_dir: bool) -> str:
    """Why these pods cannot be removed without force/deleteEmptyDir ('' when they can)."""
    for pod in pods:
        if not pod.controlled and not force:
            return f"pod {pod.namespace}/{pod.name} has no controller (set force: true to delete it)"
        if pod.empty_dir and not empty_dir:
            return f"pod {pod.namespace}/{pod.name} uses emptyDir (set deleteEmptyDir: true to delete it)"
    return ""


def decide(
    pods: Sequence[PodFacts],
    started: float | None,
    timeout: int,
    now: float,
    *,
    force: bool,
    empty_dir: bool,
    what: str,
) -> DrainDecision:
    """The drain of the chosen `pods` begun at `started` (None: not yet), `timeout` seconds (0: no
    limit); `what` names it in the messages ("drain", "GPU pod deletion", "GPU pod drain")."""
    if not pods:
        return DrainDecision(DONE)
    blocker = blockers(pods, force, empty_dir)
    if blocker:
        return DrainDecision(FAILED, f"{what} refused: {blocker}")
    if started is None:
        return DrainDecision(
            WAIT, start=str(int(now)), evict=tuple(pods), message=f"Scheduling {what} of the node"
        )
    if timeout > 0 and now - started > timeout:
        blocked = sorted({p.blocked_by for p in pods if p.blocked_by})
        if blocked:
            pdb = ", ".join(blocked)
            names = ", ".join(f"{p.namespace}/{p.name}" for p in pods if p.blocked_by)
            return DrainDecision(
                FAILED, f"{what} blocked by PodDisruptionBudget {pdb} (pod {names}) for {timeout}s"
            )
        names = ", ".join(f"{p.namespace}/{p.name}" for p in pods)
        return DrainDecision(FAILED, f"{what} timed out after {timeout}s with pods left: {names}")
    return DrainDecision(WAIT, evict=tuple(p for p in pods if not p.terminating))


async def evict(kube: Kube, pods: Iterable[PodFacts], blocked: EvictionRefusals) -> None:
    """Evict each pod in turn through the Eviction API (PodDisruptionBudgets honoured); a refusal
    is remembered in `blocked` under the budget's name, an eviction accepted forgets it."""
    for pod in pods:
        answer = await kube.evict(pod.namespace, pod.name)
        if answer.refused_by:
            blocked[(pod.namespace, pod.name)] = answer.refused_by
        else:
            blocked.pop((pod.namespace, pod.name), None)
