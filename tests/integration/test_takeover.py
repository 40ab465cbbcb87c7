"""Taking over a cluster that NVIDIA's operator v26.7.0 runs, and handing it back.

The starting state is what NVIDIA's operator wrote on a simulator (tests/fixtures/nvidia-v26.7.0,
recorded once by tools/takeover/record.py; NVIDIA's binary is not needed here): its ClusterPolicy
with status, the operand DaemonSets, RBAC, RuntimeClasses, ConfigMaps and Services it owns, and
its labels on the nodes. The real DaemonSet controller makes the pods (kwok runs them); then our
operator starts in the same namespace, as after `helm uninstall` of NVIDIA's release (CRs kept)
and `helm install` of ours (docs/migrate.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator.controllers.units.upgrade.state import ACTIVE, UPGRADE_DONE, UPGRADE_REQUIRED
from gpu_operator.kube.client import FIELD_MANAGER, ClusterPolicyResource
from gpu_operator.kube.resources import resource_for
from gpu_operator.sim.plane.operator_process import OperatorProcess
from gpu_operator.vocabulary import COMPONENT, UPGRADE_STATE
from tests.support import takeover
from tests.support.cleanup import delete_if_present
from tests.support.status import reconciled
from tests.support.takeover import driver_pods_kept, not_rolled, pods_by_owner
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]


def applied_by_us(obj: Any) -> bool:
    return any(
        f.manager == FIELD_MANAGER and f.operation == "Apply" for f in obj.metadata.managedFields or []
    )


def daemonsets(kube: Client, namespace: str) -> dict[str, DaemonSet]:
    return {str(ds.metadata.name): ds for ds in kube.list(DaemonSet, namespace=namespace)}


def all_scheduled(kube: Client, namespace: str) -> dict[str, Any]:
    """DaemonSet -> (ready, desired) while any is short; {} once every one is fully ready."""
    short: dict[str, Any] = {}
    for name, ds in daemonsets(kube, namespace).items():
        status = ds.status
        if status is None or not status.observedGeneration:  # the DaemonSet controller not there yet
            short[name] = (0, None)
            continue
        desired, ready = status.desiredNumberScheduled, status.numberReady
        if ready < desired or (name == "nvidia-driver-daemonset" and desired == 0):
            short[name] = (ready, desired)
    return short


def exists(kube: Client, obj: dict[str, Any]) -> bool:
    meta = obj["metadata"]
    try:
        kube.get(resource_for(obj["apiVersion"], obj["kind"]), meta["name"], namespace=meta.get("namespace"))
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return True


def leftovers(kube: Client, loaded: takeover.Loaded) -> list[str]:
    """NVIDIA's objects (from the fixture) still there that our operator did not apply."""
    out = []
    for obj in loaded.objects:
        meta = obj["metadata"]
        try:
            live = kube.get(
                resource_for(obj["apiVersion"], obj["kind"]), meta["name"], namespace=meta.get("namespace")
            )
        except ApiError as err:
            if err.status.code == 404:
                continue
            raise
        if not applied_by_us(live):
            out.append(f"{obj['kind']}/{meta['name']}")
    return out


class DriverWitness:
    """Watches the driver pods and the nodes' upgrade state while the take-over runs: the most
    nodes at once without a Ready driver pod, and the most nodes at once in an active upgrade
    state (the test's independent witness of "never all at once")."""

    def __init__(self, kube: Client, namespace: str, nodes: list[str]) -> None:
        self.kube, self.namespace, self.nodes = kube, namespace, set(nodes)
        self.without_driver_peak = 0
        self.active_peak = 0
        self.history: dict[str, list[str]] = {n: [] for n in nodes}
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._pods, daemon=True),
            threading.Thread(target=self._states, daemon=True),
        ]

    def _pods(self) -> None:
        while not self.stop.is_set():
            pods = self.kube.list(Pod, namespace=self.namespace, labels={COMPONENT: "nvidia-driver"})
            ready = {
                p.spec.nodeName
                for p in pods
                if not p.metadata.deletionTimestamp
                and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            }
            self.without_driver_peak = max(self.without_driver_peak, len(self.nodes - ready))
            time.sleep(0.05)

    def _states(self) -> None:
        # One list a sample: the nodes' states at one resourceVersion. A GET a node read them at
        # different moments, and on a loaded machine (three workers on 2 cores) one node's last
        # active state and the next node's first were seen as two at once, though the operator
        # had written the first node's upgrade-done before it began the next.
        while not self.stop.is_set():
            states = {}
            for item in self.kube.list(Node):
                node = item.metadata.name
                if node not in self.nodes:
                    continue
                state = (item.metadata.labels or {}).get(UPGRADE_STATE, "")
                states[node] = state
                if not self.history[node] or self.history[node][-1] != state:
                    self.history[node].append(state)
            self.active_peak = max(self.active_peak, sum(1 for s in states.values() if s in ACTIVE))
            time.sleep(0.05)

    def __enter__(self) -> DriverWitness:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)


def test_takeover_keeps_the_policy_and_rolls_the_driver_one_node_at_a_time(
    kube: Client, fake_nodes: Nodes, start_operator: Start, operator_namespace: str
) -> None:
    recorded = takeover.recorded_nodes()
    nodes = fake_nodes(*[f"{r['shape']}:1" for r in recorded])
    loaded = takeover.load(kube, operator_namespace, nodes)
    try:
        recorded_sets = loaded.named("DaemonSet")
        wait_for(
            "NVIDIA's operand pods running on every node they select",
            lambda: all_scheduled(kube, operator_namespace),
            until=lambda short: not short,
            timeout=120,
        )
        before_sets = daemonsets(kube, operator_namespace)
        before_pods = pods_by_owner(kube, operator_namespace)
        assert set(before_sets) == set(recorded_sets)
        assert len(before_pods["nvidia-driver-daemonset"]) == len(nodes)
        policy_spec = kube.get(ClusterPolicyResource, "cluster-policy")["spec"]
        max_parallel = policy_spec["driver"]["upgradePolicy"]["maxParallelUpgrades"]

        with DriverWitness(kube, operator_namespace, nodes) as witness:
            operator = start_operator()
            wait_for(
                "every NVIDIA DaemonSet applied by our operator",
                lambda: [
                    n for n, ds in daemonsets(kube, operator_namespace).items() if not applied_by_us(ds)
                ],
                until=lambda left: not left,
                timeout=120,
                context=operator.log_text,
            )
            wait_for(
                "every node's driver replaced through the upgrade controller (upgrade-done)",
                lambda: {n: s[-1] for n, s in witness.history.items()},
                until=lambda last: (
                    set(last.values()) == {UPGRADE_DONE} and all(len(witness.history[n]) > 1 for n in nodes)
                ),
                timeout=180,
                context=operator.log_text,
            )
            policy = reconciled(kube, timeout=240, context=operator.log_text)
        # Kept and reconciled, not recreated.
        assert kube.get(ClusterPolicyResource, "cluster-policy")["metadata"]["uid"] == loaded.policy_uid
        assert policy["state"] == "ready"
        after_sets = daemonsets(kube, operator_namespace)
        after_pods = pods_by_owner(kube, operator_namespace)
        for name, ds in after_sets.items():
            assert [r.uid for r in ds.metadata.ownerReferences or []] == [loaded.policy_uid], name
        # Ours carries NVIDIA's selectors (GFD's and the validator's with app.kubernetes.io/part-of):
        # every DaemonSet of NVIDIA's was applied over, none deleted and created again.
        for name in before_sets:
            assert after_sets[name].spec.selector == before_sets[name].spec.selector, name
            assert after_sets[name].metadata.uid == before_sets[name].metadata.uid, name
        # A DaemonSet whose pod template we render as NVIDIA did keeps its pods (none does in
        # this fixture: every template differs; see docs/migrate.md).
        for name in before_sets:
            if before_sets[name].spec.template == after_sets[name].spec.template:
                assert after_pods.get(name) == before_pods.get(name), (
                    f"{name}: restarted with the same template"
                )
        # The driver's template differs: its pods were replaced, by the upgrade controller, at
        # most maxParallelUpgrades nodes at a time, never all at once.
        assert not set(after_pods["nvidia-driver-daemonset"]) & set(before_pods["nvidia-driver-daemonset"])
        assert 1 <= witness.active_peak <= max_parallel, witness.history
        assert witness.without_driver_peak <= max_parallel, witness.history
        for node in nodes:
            assert UPGRADE_REQUIRED in witness.history[node], witness.history[node]
        # NVIDIA's objects we do not render (the driver's and device plugin's Roles/RoleBindings:
        # ours grant those operands no namespaced rights) are deleted: controlled by the same
        # ClusterPolicy and not labelled ours. Everything else of NVIDIA's was applied over.
        assert leftovers(kube, loaded) == []
        gone = [f"{o['kind']}/{o['metadata']['name']}" for o in loaded.objects if not exists(kube, o)]
        assert "Role/nvidia-driver" in gone and "RoleBinding/nvidia-driver" in gone, gone

        # And back (docs/migrate.md): ours stopped with the ClusterPolicy kept. What NVIDIA's
        # operator (it writes DaemonSets with update, which cannot change a selector) needs: every
        # DaemonSet has NVIDIA's selector, the ClusterPolicy and its CRD are there, the pods still
        # run; nothing is deleted for it.
        operator.stop()
        pods_then = pods_by_owner(kube, operator_namespace)
        for name, ds in daemonsets(kube, operator_namespace).items():
            assert ds.spec.selector.to_dict() == recorded_sets[name]["spec"]["selector"], name
        assert set(daemonsets(kube, operator_namespace)) == set(recorded_sets)
        assert kube.get(ClusterPolicyResource, "cluster-policy")["metadata"]["uid"] == loaded.policy_uid
        kube.get(CustomResourceDefinition, "clusterpolicies.nvidia.com")
        assert pods_by_owner(kube, operator_namespace) == pods_then
        assert all(pods_then.values())
    finally:
        delete_if_present(kube, ClusterPolicyResource, "cluster-policy")


def status_written_by_us(policy: dict[str, Any]) -> bool:
    """Our status, not NVIDIA's recorded one: both operators' field manager is `gpu-operator`, so
    managedFields alone cannot tell them apart; our conditions carry observedGeneration, NVIDIA's
    (tests/fixtures/nvidia-v26.7.0/policy.yaml) none."""
    conditions = (policy.get("status") or {}).get("conditions") or []
    return any(
        f.get("manager") == FIELD_MANAGER and f.get("subresource") == "status"
        for f in policy["metadata"].get("managedFields") or []
    ) and any(c.get("type") == "Ready" and "observedGeneration" in c for c in conditions)


def test_takeover_with_auto_upgrade_off_keeps_every_driver_pod(
    kube: Client, fake_nodes: Nodes, start_operator: Start, operator_namespace: str
) -> None:
    """docs/migrate.md: with `driver.upgradePolicy.autoUpgrade: false` the take-over restarts no
    driver pod; the driver DaemonSet (OnDelete) carries our template and its pods stay on NVIDIA's
    until an upgrade replaces them. The recorded state with that one value changed (the nodes keep
    NVIDIA's `upgrade-done` labels, as after turning auto-upgrade off on a running cluster)."""
    driver = "nvidia-driver-daemonset"
    recorded = takeover.recorded_nodes()
    nodes = fake_nodes(*[f"{r['shape']}:1" for r in recorded])
    off = {"driver": {"upgradePolicy": {"autoUpgrade": False}}}
    takeover.load(kube, operator_namespace, nodes, spec=off)
    try:
        wait_for(
            "NVIDIA's operand pods running on every node they select",
            lambda: all_scheduled(kube, operator_namespace),
            until=lambda short: not short,
            timeout=120,
        )
        before_sets = daemonsets(kube, operator_namespace)
        before_pods = pods_by_owner(kube, operator_namespace)
        assert len(before_pods[driver]) == len(nodes)
        operator = start_operator()
        reconciled(kube, timeout=120, context=operator.log_text)
        wait_for(
            "the status written by our operator",
            lambda: dict(kube.get(ClusterPolicyResource, "cluster-policy")),
            until=status_written_by_us,
            timeout=60,
            context=operator.log_text,
        )

        wait_for(
            "every other operand's pods replaced",
            lambda: not_rolled(
                kube, operator_namespace, before_pods, driver, all_scheduled(kube, operator_namespace)
            ),
            until=lambda left: not left,
            timeout=120,
            context=operator.log_text,
        )
        assert pods_by_owner(kube, operator_namespace)[driver] == before_pods[driver]
        wait_for(
            "NVIDIA's upgrade-state labels taken off (auto-upgrade off)",
            lambda: [n for n in nodes if UPGRADE_STATE in (kube.get(Node, n).metadata.labels or {})],
            until=lambda left: not left,
            timeout=60,
            context=operator.log_text,
        )
        ds = daemonsets(kube, operator_namespace)[driver]
        assert applied_by_us(ds) and ds.spec.updateStrategy.type == "OnDelete"
        assert ds.spec.template != before_sets[driver].spec.template
        driver_pods_kept(kube, operator_namespace, driver, before_pods[driver])
    finally:
        delete_if_present(kube, ClusterPolicyResource, "cluster-policy")
