"""Crash anywhere: the default policy (with driver auto-upgrade) on kwok nodes, installed and
then upgraded once without interruption (the reference), then again from scratch while the
operator is SIGKILLed at 20 points spread across the work: before its first write, after the
Nth object applied, mid-labelling, right after a status write, and during upgrade steps.

Kill points are observed API effects, not hooks in the operator: the test tails the apiserver's
audit log and SIGKILLs the process when the Nth write of a kind (by this incarnation) has landed.
A restarted operator finds little left to do, so before each incarnation the test hands it work
of the kind the point needs, as a cluster would (someone strips our node labels, edits an object
we applied, overwrites our status); the final state must match the reference all the same.

Default: 24 nodes. GPU_OPERATOR_CHAOS_HEAVY=1: 200 nodes (the issue's figure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from gpu_operator.controllers.units.upgrade.state import UPGRADE_DONE
from gpu_operator.controllers.watchedkinds import OWNED_KINDS
from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import HASH_ANNOTATION, MANAGED_SELECTOR, UPGRADE_STATE
from tests.support.chaos import HEAVY, AuditTail, category
from tests.support.status import is_reconciled, policy_status
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]
NODES = 200 if HEAVY else 24
# With 24 nodes the labeller's 32 patches in flight finish in one batch, faster than a kill can
# react; four at a time spreads them so the mid-labelling points land mid-labelling. 200 nodes
# are labelled in several batches at the default.
ARGS = [] if HEAVY else ["--label-concurrency=4"]
# upgrades in one wave, short timeouts: kwok pods have no workloads to wait for
SPEC = {
    "driver": {
        "upgradePolicy": {
            "autoUpgrade": True,
            "maxParallelUpgrades": 0,
            "maxUnavailable": "100%",
            "podDeletion": {"timeoutSeconds": 4},
            "drain": {"enable": False},
        }
    }
}
NEXT_DRIVER = {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}
DRIVER_PODS: dict[str, Any] = {"app.kubernetes.io/component": "nvidia-driver"}


@dataclass(frozen=True)
class Point:
    kind: str  # "start": after discovery, before any write; else a write category (tests/support/chaos.py)
    nth: int  # SIGKILL once this incarnation's nth write of that kind has landed


def points(n: int) -> list[Point]:
    install = [
        Point("start", 0),
        Point("apply", 1),
        Point("label", 1),
        Point("apply", 4),
        Point("status", 1),
        Point("label", n // 4),
        Point("apply", 10),
        Point("label", n // 2),
        Point("status", 1),
        Point("apply", 2),
        Point("label", 3 * n // 4),
        Point("start", 0),
        Point("status", 1),
        Point("label", 2),
        Point("apply", 6),
        Point("label", n - 2),
    ]
    upgrade = [Point("label", 3), Point("label", n), Point("pod", 1), Point("label", 2 * n)]
    return install + upgrade


def _prefix(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


def managed(kube: Client, control_plane: ControlPlane) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every object with our managed-by label, normalized: no uids, versions, times, status, and
    no ownerReference uid or hash annotation (both differ between two installs by design)."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for owned in OWNED_KINDS:
        plural = owned.plural
        body = control_plane.request(
            "GET", f"{_prefix(owned.group, owned.version)}/{plural}?labelSelector={MANAGED_SELECTOR}"
        )
        for item in body["items"]:
            meta = item["metadata"]
            key = (plural, meta.get("namespace", ""), meta["name"])
            assert key not in out, f"duplicate {key}"
            clean = {k: v for k, v in item.items() if k not in ("metadata", "status")}
            if plural == "services":  # allocated by the apiserver on create, different every install
                clean["spec"] = {
                    k: v for k, v in clean["spec"].items() if k not in ("clusterIP", "clusterIPs")
                }
            clean["labels"] = meta.get("labels", {})
            clean["annotations"] = {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k not in (HASH_ANNOTATION, "deprecated.daemonset.template.generation")
            }
            clean["owners"] = sorted(
                (r["kind"], r["name"], r.get("controller", False)) for r in meta.get("ownerReferences", [])
            )
            out[key] = clean
    return out


def node_state(kube: Client, names: list[str], original: dict[str, dict[str, str]]) -> dict[str, Any]:
    state = {}
    for name in names:
        node = kube.get(Node, name)
        labels = {k: v for k, v in (node.metadata.labels or {}).items() if original[name].get(k) != v}
        # "...-since" annotations are times (when a node entered its upgrade state): present, not equal
        annotations = {
            k: "<time>" if k.endswith("-since") else v
            for k, v in (node.metadata.annotations or {}).items()
            if "nvidia.com" in k
        }
        taints = sorted(str(t.key) for t in (node.spec.taints or []))
        state[name] = {
            "labels": labels,
            "annotations": annotations,
            "unschedulable": bool(node.spec.unschedulable),
            "taints": taints,
        }
    return state


def policy_state(kube: Client) -> dict[str, Any]:
    status = policy_status(kube)
    conditions = sorted(
        (c["type"], c["status"], c.get("reason", ""), c.get("message", ""))
        for c in status.get("conditions", [])
    )
    return {"state": status.get("state"), "namespace": status.get("namespace"), "conditions": conditions}


def snapshot(
    kube: Client,
    control_plane: ControlPlane,
    names: list[str],
    namespace: str,
    original: dict[str, dict[str, str]],
) -> dict[str, Any]:
    pods: dict[str, int] = {}
    for pod in kube.list(Pod, namespace=namespace, labels=DRIVER_PODS):
        pods[str(pod.spec.nodeName)] = pods.get(str(pod.spec.nodeName), 0) + 1
    return {
        "objects": managed(kube, control_plane),
        "nodes": node_state(kube, names, original),
        "policy": policy_state(kube),
        "driver_pods_per_node": pods,
    }


def converged(
    kube: Client, names: list[str], gpu: list[str], driver_version: str | None, namespace: str
) -> bool:
    if not is_reconciled(policy_status(kube)):
        return False
    states = {n: (kube.get(Node, n).metadata.labels or {}).get(UPGRADE_STATE) for n in gpu}
    if set(states.values()) != {UPGRADE_DONE}:
        return False
    pods = list(kube.list(Pod, namespace=namespace, labels=DRIVER_PODS))
    if len(pods) != len(gpu) or any(p.status.phase != "Running" for p in pods):
        return False
    return driver_version is None or all(driver_version in str(p.spec.containers[0].image) for p in pods)


def quiet(control_plane: ControlPlane, seconds: float = 3.0) -> None:
    """Waits until the operator has sent no write for `seconds` (its work is done)."""
    tail = AuditTail(control_plane)
    last = time.monotonic()

    def still() -> bool:
        nonlocal last
        if tail.new():
            last = time.monotonic()
        return time.monotonic() - last >= seconds

    wait_for("the operator to stop writing", still, timeout=120, interval=0.5)


def reset(
    kube: Client,
    control_plane: ControlPlane,
    names: list[str],
    original: dict[str, dict[str, str]],
    namespace: str,
) -> None:
    """Back to before the install: the policy deleted, what it owned collected, nodes as created."""
    kube.delete(ClusterPolicyResource, "cluster-policy")
    wait_for(
        "every managed object garbage-collected",
        lambda: managed(kube, control_plane),
        until=lambda m: not m,
        timeout=120,
    )
    wait_for(
        "driver pods gone",
        lambda: list(kube.list(Pod, namespace=namespace, labels=DRIVER_PODS)),
        until=lambda p: not p,
        timeout=120,
    )
    strip_labels(kube, names, original)


def strip_labels(kube: Client, names: list[str], original: dict[str, dict[str, str]]) -> None:
    """Someone removes every label and annotation the operator put on the nodes."""
    for name in names:
        node = kube.get(Node, name)
        drop = {k: None for k in (node.metadata.labels or {}) if k not in original[name]}
        notes = {k: None for k in (node.metadata.annotations or {}) if "nvidia.com" in k}
        if drop or notes:
            kube.patch(
                Node, name, {"metadata": {"labels": drop, "annotations": notes}}, patch_type=PatchType.MERGE
            )


def give_work(
    kube: Client,
    control_plane: ControlPlane,
    point: Point,
    names: list[str],
    original: dict[str, dict[str, str]],
) -> None:
    """Pending work of the point's kind for the next incarnation."""
    if point.kind == "label":
        strip_labels(kube, names, original)
    elif point.kind == "apply":
        for plural, namespace, name in sorted(managed(kube, control_plane))[: point.nth + 4]:
            owned = next(k for k in OWNED_KINDS if k.plural == plural)
            prefix = _prefix(owned.group, owned.version)
            path = (
                f"{prefix}/namespaces/{namespace}/{plural}/{name}"
                if namespace
                else f"{prefix}/{plural}/{name}"
            )
            control_plane.request(
                "PATCH",
                path,
                {"metadata": {"annotations": {HASH_ANNOTATION: "edited"}}},
                content_type="application/merge-patch+json",
            )
    elif point.kind == "status":
        with_retry(
            lambda: kube.patch(
                ClusterPolicyResource.Status,
                "cluster-policy",
                {"status": {"state": "notReady"}},
                patch_type=PatchType.MERGE,
            )
        )


def with_retry(call: Callable[[], object]) -> None:
    for _ in range(5):
        try:
            call()
            return
        except ApiError as err:
            if err.status.code != 409:
                raise
    call()


def crash_at(point: Point, start_operator: Start, control_plane: ControlPlane, timeout: float = 60.0) -> str:
    """Starts an incarnation and SIGKILLs it at the point; returns what had landed by then."""
    tail = AuditTail(control_plane)
    operator = start_operator(extra_args=ARGS)
    counts: dict[str, int] = {}
    seen: list[str] = []

    def reached() -> bool:
        for event in tail.new():
            kind = category(event)
            counts[kind] = counts.get(kind, 0) + 1
            ref = event["objectRef"]
            seen.append(
                f"{event['verb']} {ref.get('resource')}/{ref.get('name')}{'/' + ref['subresource'] if ref.get('subresource') else ''}"
            )
        if point.kind == "start":
            return "ServiceMonitor CRD" in operator.log_text()  # discovery done, loops about to start
        return counts.get(point.kind, 0) >= point.nth

    wait_for(f"crash point {point}", reached, timeout=timeout, interval=0.02, context=operator.log_text)
    operator.kill()
    counts = {k: v for k, v in counts.items() if v}
    for event in tail.new():  # what landed between the observation and the SIGKILL
        counts[category(event)] = counts.get(category(event), 0) + 1
    return (
        f"{point.kind}#{point.nth}: killed after {counts or 'no writes'}; last: {seen[-1] if seen else '-'}"
    )


def test_sigkill_at_20_points_ends_where_an_uninterrupted_run_ends(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    gpu = fake_nodes(f"dgx-h100:{NODES - 2}")
    names = gpu + fake_nodes("cpu:2")
    original = {n: dict(kube.get(Node, n).metadata.labels or {}) for n in names}
    settle = 300 if HEAVY else 180

    # The reference: install, then one driver upgrade, never interrupted.
    began = time.monotonic()
    operator = start_operator(extra_args=ARGS)
    cluster_policies(SPEC)
    wait_for(
        "reference install converged",
        lambda: converged(kube, names, gpu, None, operator_namespace),
        timeout=settle,
        interval=1,
        context=operator.log_text,
    )
    kube.patch(
        ClusterPolicyResource, "cluster-policy", {"spec": {"driver": NEXT_DRIVER}}, patch_type=PatchType.MERGE
    )
    wait_for(
        "reference upgrade converged",
        lambda: converged(kube, names, gpu, NEXT_DRIVER["version"], operator_namespace),
        timeout=settle,
        interval=1,
        context=operator.log_text,
    )
    quiet(control_plane)
    reference = snapshot(kube, control_plane, names, operator_namespace, original)
    operator.stop()
    reference_seconds = time.monotonic() - began
    reset(kube, control_plane, names, original, operator_namespace)

    # Someone's own object in the operator namespace: nothing may delete it.
    kube.create(
        ConfigMap(metadata=ObjectMeta(name="users-own", namespace=operator_namespace), data={"k": "v"})
    )

    # The same again, SIGKILLed at every point.
    cluster_policies(SPEC)
    log: list[str] = []
    plan = points(len(names))
    install, upgrade = plan[:16], plan[16:]
    for i, point in enumerate(install):
        if i >= 1:
            give_work(kube, control_plane, point, names, original)
        log.append(crash_at(point, start_operator, control_plane))
    # Converge the install, then start the upgrade and crash through it.
    operator = start_operator(extra_args=ARGS)
    wait_for(
        "install converged after the crashes",
        lambda: converged(kube, names, gpu, None, operator_namespace),
        timeout=settle,
        interval=1,
        context=operator.log_text,
    )
    operator.kill()
    kube.patch(
        ClusterPolicyResource, "cluster-policy", {"spec": {"driver": NEXT_DRIVER}}, patch_type=PatchType.MERGE
    )
    for point in upgrade:
        log.append("upgrade " + crash_at(point, start_operator, control_plane))
    operator = start_operator(extra_args=ARGS)
    wait_for(
        "upgrade converged after the crashes",
        lambda: converged(kube, names, gpu, NEXT_DRIVER["version"], operator_namespace),
        timeout=settle,
        interval=1,
        context=lambda: "\n".join(log) + "\n" + operator.log_text()[-3000:],
    )
    quiet(control_plane)
    after = snapshot(kube, control_plane, names, operator_namespace, original)
    print(
        f"reference run {reference_seconds:.0f} s on {len(names)} nodes; {len(log)} SIGKILLs:\n  "
        + "\n  ".join(log)
    )

    assert len(log) == 20
    assert kube.get(ConfigMap, "users-own", namespace=operator_namespace).data == {"k": "v"}
    assert after["objects"].keys() == reference["objects"].keys(), "objects missing or extra (duplicates)"
    differing = [key for key, obj in reference["objects"].items() if after["objects"][key] != obj]
    assert not differing, [(key, reference["objects"][key], after["objects"][key]) for key in differing]
    differing = [n for n in names if after["nodes"][n] != reference["nodes"][n]]
    assert not differing, [(n, reference["nodes"][n], after["nodes"][n]) for n in differing]
    assert after["policy"] == reference["policy"]
    assert after["driver_pods_per_node"] == reference["driver_pods_per_node"]
    assert set(after["driver_pods_per_node"].values()) == {1}
