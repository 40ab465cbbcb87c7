"""Taking over a cluster where NVIDIA's operator v26.7.0 runs the driver from an NVIDIADriver.

The starting state is what NVIDIA's operator wrote on a simulator with its chart's NVIDIADriver CRD
on (tests/fixtures/nvidia-v26.7.0-nvidiadriver, recorded once by tools/takeover/record.py): the
ClusterPolicy (driver.useNvidiaDriverCRD) and the NVIDIADriver `default` with their status, the
operands each owns, its labels on the nodes. The real DaemonSet controller makes the pods (kwok runs
them); then our operator starts in the same namespace, as after `helm uninstall` of NVIDIA's
release (CRs kept) and `helm install` of ours (docs/migrate.md)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.controllers.units.upgrade.state import UPGRADE_DONE, UPGRADE_FAILED
from gpu_operator.kube.client import FIELD_MANAGER, ClusterPolicyResource, NVIDIADriverResource
from gpu_operator.kube.resources import resource_for
from gpu_operator.render.nvidiadriver import Pool, daemonset_name
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import COMPONENT, DRIVER_COMPONENT_VALUE, UPGRADE_STATE
from tests.support import takeover_nvidiadriver as recorded
from tests.support.cleanup import delete_if_present
from tests.support.status import condition, is_reconciled, policy_status
from tests.support.takeover import driver_pods_kept, not_rolled, pods_by_owner
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]


def daemonsets(kube: Client, namespace: str) -> dict[str, DaemonSet]:
    return {str(ds.metadata.name): ds for ds in kube.list(DaemonSet, namespace=namespace)}


def short_of_pods(kube: Client, namespace: str, driver: str | None = None, nodes: int = 0) -> dict[str, Any]:
    """DaemonSet -> (ready, desired) while any is short; {} once every one is fully ready. With
    `driver`: that DaemonSet is short until it wants and has a Ready pod on all `nodes` (its status
    can say 1 of 1 while the controller has not yet seen the other nodes' labels)."""
    short: dict[str, Any] = {}
    for name, ds in daemonsets(kube, namespace).items():
        status = ds.status
        if status is None or not status.observedGeneration:
            short[name] = (0, None)
        elif status.numberReady < status.desiredNumberScheduled or (
            name == driver and status.numberReady < nodes
        ):
            short[name] = (status.numberReady, status.desiredNumberScheduled)
    if driver is not None and driver not in daemonsets(kube, namespace):
        short[driver] = (0, None)
    return short


def reconciled_by_us(kube: Client, namespace: str, log: Callable[[], str]) -> dict[str, Any]:
    """The NVIDIADriver's status once it is ready (Reconciled) as ours writes it (with `namespace`,
    which NVIDIA's has not)."""
    status: dict[str, Any] = wait_for(
        "the NVIDIADriver ready (Reconciled) by our operator",
        lambda: dict(kube.get(NVIDIADriverResource, "default"))["status"],
        until=lambda s: s.get("namespace") == namespace and is_reconciled(s),
        timeout=120,
        context=log,
    )
    return status


def applied_by_us(meta: dict[str, Any]) -> bool:
    return any(
        f.get("manager") == FIELD_MANAGER and f.get("operation") == "Apply"
        for f in meta.get("managedFields") or []
    )


def name_of(kube: Client, namespace: str, uid: str) -> str:
    (pod,) = [p for p in kube.list(Pod, namespace=namespace) if p.metadata.uid == uid]
    return str(pod.metadata.name)


def ready_driver_pod(kube: Client, namespace: str, driver: str, node: str, old: set[str]) -> bool:
    """A new (not in `old`) pod of `driver` on `node`, Ready."""
    for pod in kube.list(Pod, namespace=namespace):
        refs = pod.metadata.ownerReferences or []
        if pod.spec.nodeName != node or str(pod.metadata.uid) in old or pod.metadata.deletionTimestamp:
            continue
        if any(r.name == driver and r.controller for r in refs) and any(
            c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or [])
        ):
            return True
    return False


def live(kube: Client, obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = obj["metadata"]
    resource = resource_for(obj["apiVersion"], obj["kind"])
    try:
        found = kube.get(resource, meta["name"], namespace=meta.get("namespace"))
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise
    return found if isinstance(found, dict) else found.to_dict()


def test_takeover_keeps_the_nvidiadriver_and_every_driver_pod(
    kube: Client, fake_nodes: Nodes, start_operator: Start, operator_namespace: str
) -> None:
    """docs/migrate.md: the NVIDIADriver and the ClusterPolicy are kept (same uids) and reconciled;
    the driver DaemonSet NVIDIA's operator named from the NVIDIADriver's uid is the name ours
    computes, so it is applied over (same uid), and with the NVIDIADriver's
    `upgradePolicy.autoUpgrade: false` (OnDelete) no driver pod restarts while the other operands
    roll. Of the NVIDIADriver's objects only those we do not render go (never its DaemonSet). The
    NVIDIADriver reads notReady until its driver pods are replaced, then ready."""
    nodes = fake_nodes(*[f"{r['shape']}:1" for r in recorded.recorded_nodes()])
    off = {"upgradePolicy": {"autoUpgrade": False}}
    loaded = recorded.load(kube, operator_namespace, nodes, driver_spec=off)
    driver_uid = loaded.driver_uids["default"]
    try:
        (driver_obj,) = loaded.owned_by(driver_uid, "DaemonSet").values()
        driver = driver_obj["metadata"]["name"]
        # NVIDIA's name (the hash of this NVIDIADriver's uid) is the one our render computes.
        nvd = NVIDIADriver.model_validate(kube.get(NVIDIADriverResource, "default"))
        assert driver == daemonset_name(nvd, Pool(os_tag="ubuntu22.04", node_selector={}, nodes=()))
        wait_for(
            "NVIDIA's operand pods running on every node they select",
            lambda: short_of_pods(kube, operator_namespace, driver, len(nodes)),
            until=lambda short: not short,
            timeout=120,
        )
        before_sets = daemonsets(kube, operator_namespace)
        before_pods = pods_by_owner(kube, operator_namespace)
        assert len(before_pods[driver]) == len(nodes)

        operator = start_operator()

        wait_for(
            "every other operand's pods replaced",
            lambda: not_rolled(
                kube, operator_namespace, before_pods, driver, short_of_pods(kube, operator_namespace)
            ),
            until=lambda left: not left,
            timeout=180,
            context=operator.log_text,
        )
        # Both write under the field manager `gpu-operator` and NVIDIA's status also says
        # ready/Reconciled: ours is told by its conditions' observedGeneration (NVIDIA's have none)
        # and, on the NVIDIADriver, by `namespace` (NVIDIA's has none).
        wait_for(
            "the ClusterPolicy reconciled by our operator",
            lambda: policy_status(kube),
            until=lambda s: is_reconciled(s) and "observedGeneration" in condition(s, "Ready"),
            timeout=180,
            context=operator.log_text,
        )
        nvd_now = wait_for(
            "the NVIDIADriver's status written by our operator",
            lambda: dict(kube.get(NVIDIADriverResource, "default")),
            until=lambda d: d["status"].get("namespace") == operator_namespace,
            timeout=120,
            context=operator.log_text,
        )
        # Kept and reconciled, not recreated.
        assert nvd_now["metadata"]["uid"] == driver_uid
        assert kube.get(ClusterPolicyResource, "cluster-policy")["metadata"]["uid"] == loaded.policy_uid
        # The driver DaemonSet: the same object, our template applied over, OnDelete; every
        # driver pod is still NVIDIA's (same uids), none was deleted.
        ds = daemonsets(kube, operator_namespace)[driver]
        assert ds.metadata.uid == before_sets[driver].metadata.uid
        assert pods_by_owner(kube, operator_namespace)[driver] == before_pods[driver]
        assert applied_by_us(ds.to_dict()["metadata"])
        assert [r.uid for r in ds.metadata.ownerReferences or []] == [driver_uid]
        assert ds.spec.updateStrategy.type == "OnDelete"
        assert ds.spec.template != before_sets[driver].spec.template
        driver_pods_kept(kube, operator_namespace, driver, before_pods[driver])
        # So the NVIDIADriver reads notReady (DriverNotReady) while its pods run NVIDIA's template:
        # upstream's DaemonSet rule (updated pods = available pods), ours the same.
        status = dict(kube.get(NVIDIADriverResource, "default"))["status"]
        assert status["namespace"] == operator_namespace
        assert status["state"] == "notReady"
        assert condition(status, "Error")["reason"] == "DriverNotReady"
        # What NVIDIA's operator made for the NVIDIADriver and we render was applied over; what
        # we do not render (its per-pool ServiceAccount and RBAC, its startup-probe ConfigMap: ours
        # carry the CR's name) is deleted, being controlled by the same NVIDIADriver and not
        # labelled ours. Never a DaemonSet.
        gone = []
        for key, obj in loaded.owned_by(driver_uid).items():
            now = live(kube, obj)
            if now is None:
                gone.append(key)
            else:
                assert applied_by_us(now["metadata"]), f"{key}: left as NVIDIA's"
        pool_named = "nvidia-gpu-driver-default-ubuntu22.04"
        assert sorted(gone) == sorted(
            [
                *(
                    f"{kind}/{pool_named}"
                    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
                ),
                "ConfigMap/nvidia-driver-startup-probe",
            ]
        ), gone

        # The admin replaces the driver pods node by node (after draining each): each new pod has
        # our template, and with the last one the NVIDIADriver is ready, Reconciled, by us.
        for uid, node in sorted(before_pods[driver].items(), key=lambda item: item[1]):
            kube.delete(Pod, name_of(kube, operator_namespace, uid), namespace=operator_namespace)
            on_node = functools.partial(
                ready_driver_pod, kube, operator_namespace, driver, node, set(before_pods[driver])
            )
            wait_for(
                f"our driver pod Ready on {node}",
                on_node,
                timeout=120,
                context=operator.log_text,
            )
        final = reconciled_by_us(kube, operator_namespace, operator.log_text)
        assert condition(final, "Ready")["status"] == "True"
        assert daemonsets(kube, operator_namespace)[driver].metadata.uid == before_sets[driver].metadata.uid
    finally:
        delete_if_present(kube, NVIDIADriverResource, "default")
        delete_if_present(kube, ClusterPolicyResource, "cluster-policy")


class DriverWatch:
    """Polls the driver pods and the nodes' upgrade state while the take-over runs: the most
    nodes at once without a Ready driver pod, and each node's upgrade-state history."""

    def __init__(self, kube: Client, namespace: str, nodes: list[str]) -> None:
        self.kube, self.namespace, self.nodes = kube, namespace, set(nodes)
        self.without_driver_peak = 0
        self.history: dict[str, list[str]] = {n: [] for n in nodes}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            pods = self.kube.list(Pod, namespace=self.namespace, labels={COMPONENT: DRIVER_COMPONENT_VALUE})
            ready = {
                p.spec.nodeName
                for p in pods
                if not p.metadata.deletionTimestamp
                and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            }
            self.without_driver_peak = max(self.without_driver_peak, len(self.nodes - ready))
            for node in self.nodes:
                state = (self.kube.get(Node, node).metadata.labels or {}).get(UPGRADE_STATE, "")
                if not self.history[node] or self.history[node][-1] != state:
                    self.history[node].append(state)
            time.sleep(0.1)

    def __enter__(self) -> DriverWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join(5)


def test_takeover_with_auto_upgrade_rolls_the_nvidiadrivers_pods_one_node_at_a_time(
    kube: Client, fake_nodes: Nodes, start_operator: Start, operator_namespace: str
) -> None:
    """The recorded NVIDIADriver as NVIDIA's chart made it (`autoUpgrade: true`,
    `maxParallelUpgrades: 1`): our upgrade controller replaces each node's driver pod with one of
    our template, one node at a time, every node ends `upgrade-done` (none `upgrade-failed`: the
    other operands' pods it meets in a drain are the DaemonSets', controllers/drain.py), and the
    NVIDIADriver is ready, by us."""
    nodes = fake_nodes(*[f"{r['shape']}:1" for r in recorded.recorded_nodes()])
    loaded = recorded.load(kube, operator_namespace, nodes)
    driver_uid = loaded.driver_uids["default"]
    try:
        (driver,) = [o["metadata"]["name"] for o in loaded.owned_by(driver_uid, "DaemonSet").values()]
        wait_for(
            "NVIDIA's operand pods running on every node they select",
            lambda: short_of_pods(kube, operator_namespace, driver, len(nodes)),
            until=lambda short: not short,
            timeout=120,
        )
        before_set = daemonsets(kube, operator_namespace)[driver]
        before = pods_by_owner(kube, operator_namespace)[driver]
        max_parallel = kube.get(NVIDIADriverResource, "default")["spec"]["upgradePolicy"][
            "maxParallelUpgrades"
        ]
        with DriverWatch(kube, operator_namespace, nodes) as watch:
            operator = start_operator()
            wait_for(
                "every node's driver pod replaced through the upgrade controller (upgrade-done)",
                lambda: {n: s[-1] if s else "" for n, s in watch.history.items()},
                until=lambda last: (
                    set(last.values()) == {UPGRADE_DONE} and all(len(watch.history[n]) > 1 for n in nodes)
                ),
                timeout=240,
                context=operator.log_text,
            )
            final = reconciled_by_us(kube, operator_namespace, operator.log_text)
        assert condition(final, "Ready")["status"] == "True"
        assert kube.get(NVIDIADriverResource, "default")["metadata"]["uid"] == driver_uid
        assert kube.get(ClusterPolicyResource, "cluster-policy")["metadata"]["uid"] == loaded.policy_uid
        assert daemonsets(kube, operator_namespace)[driver].metadata.uid == before_set.metadata.uid
        after = pods_by_owner(kube, operator_namespace)[driver]
        assert len(after) == len(nodes) and not set(after) & set(before)
        assert all(UPGRADE_FAILED not in states for states in watch.history.values()), watch.history
        assert watch.without_driver_peak <= max_parallel, watch.history
    finally:
        delete_if_present(kube, NVIDIADriverResource, "default")
        delete_if_present(kube, ClusterPolicyResource, "cluster-policy")
