"""Carries out the remediation machine's steps (controllers/units/health/machine.py): one merge patch per
node transition (HEALTH_STATE label, our annotations, the handoff label, the cordon), evictions
through the Eviction API (a PodDisruptionBudget's refusal is remembered and named when the drain
times out), and the pod restarts: the device plugin's pod on the node (it registers the healthy
devices again) or the driver pod (the driver reloads). GPU resets and reboots are requests the node
agent acts on: the node's entry in the requests Secret in the operator's namespace, which only the
operator may write (kube/nodestatus.py put_request), withdrawn once the agent's report answers it."""

from __future__ import annotations

import logging
from typing import Any

from gpu_operator.controllers import drain as node_drain
from gpu_operator.controllers.gpuholders import RuntimeAccess
from gpu_operator.controllers.units.health.machine import GPU_CLIENT_APPS, VALIDATOR_RESTART, RemediationStep
from gpu_operator.kube import nodestatus
from gpu_operator.kube.client import Kube
from gpu_operator.kube.resources import ObjectKey
from gpu_operator.vocabulary import COMPONENT, DRIVER_COMPONENT_VALUE, HEALTH_STATE

log = logging.getLogger("gpu_operator.health")

DEVICE_PLUGIN_SELECTOR = "app=nvidia-device-plugin-daemonset"  # render/states/device_plugin.py's DaemonSet
DRIVER_SELECTOR = f"{COMPONENT}={DRIVER_COMPONENT_VALUE}"
VALIDATOR_SELECTOR = "app=nvidia-operator-validator"  # render/states/operator_validation.py's DaemonSet
# the pods each action deletes on the node, in order; the validator's last: its new pod validates
# the node afresh (its status files newer than the action, machine.REVALIDATED)
RESTARTS = {
    "restart-device-plugin": (DEVICE_PLUGIN_SELECTOR, VALIDATOR_SELECTOR),
    "reload-driver": (DRIVER_SELECTOR, VALIDATOR_SELECTOR),
    VALIDATOR_RESTART: (VALIDATOR_SELECTOR,),
}


def node_patch(step: RemediationStep) -> dict[str, Any]:
    """One merge patch for a node's transition."""
    meta: dict[str, Any] = {}
    labels: dict[str, str | None] = dict(step.labels)
    if step.state is not None:
        labels[HEALTH_STATE] = step.state
    if step.remove_state:
        labels[HEALTH_STATE] = None
    if labels:
        meta["labels"] = labels
    if step.notes:
        meta["annotations"] = dict(step.notes)
    patch: dict[str, Any] = {"metadata": meta} if meta else {}
    if step.cordon is not None:
        patch["spec"] = {"unschedulable": step.cordon}
    return patch


class Executor:
    def __init__(self, kube: Kube, namespace: str = "gpu-operator") -> None:
        self.kube, self.namespace = kube, namespace
        self.blocked: node_drain.EvictionRefusals = {}  # pod -> the PodDisruptionBudget that refused it

    async def pod_facts(
        self, node: str, selector: str | None, access: RuntimeAccess | None = None
    ) -> tuple[node_drain.PodFacts, ...]:
        """The pods on a draining node (controllers/drain.py); `selector`: only the pods it matches
        may be evicted; `access`: how pods reach GPUs without asking for them (the ClusterPolicy's runtime)."""
        return await node_drain.pods_on(
            self.kube,
            node,
            self.blocked,
            access=access or RuntimeAccess(),
            drain_selector=selector or "",
            operands=self.namespace,
        )

    async def gpu_clients(self, node: str) -> tuple[str, ...]:
        """The GPU client pods (device plugin, DCGM, its exporter, GFD, MIG manager) still on a node:
        one list of the node's pods with any of their app labels."""
        found = []
        for body in await self.kube.list_pods(
            fields=f"spec.nodeName={node}", labels=f"app in ({','.join(GPU_CLIENT_APPS)})"
        ):
            meta = body.get("metadata") or {}
            found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        return tuple(sorted(found))

    async def run(self, step: RemediationStep) -> None:
        patch = node_patch(step)
        if patch:  # the Node first: the agent admits a request only for the attempt its Node is in
            await self.kube.merge_patch("v1", "Node", step.node, patch)
        if step.request:
            await nodestatus.put_request(self.kube, self.namespace, step.node, step.request)
        elif step.withdraw:
            await nodestatus.put_request(self.kube, self.namespace, step.node, None)
        await node_drain.evict(self.kube, step.evict, self.blocked)
        for selector in RESTARTS.get(step.action, ()):
            for body in await self.kube.list_pods(fields=f"spec.nodeName={step.node}", labels=selector):
                meta = body.get("metadata") or {}
                log.info(
                    "node %s: %s: deleting pod %s/%s",
                    step.node,
                    step.action,
                    meta.get("namespace"),
                    meta.get("name"),
                )
                await self.kube.delete(ObjectKey("v1", "Pod", meta["name"], meta.get("namespace")))
        if step.message:
            log.info("node %s: %s", step.node, step.message)


async def take_back(kube: Kube, node: dict[str, Any]) -> list[str]:
    """What uninstall cleanup must undo of GPU health on one node (its labels and annotations go
    with the operator's other keys): our condition, the quarantine taint, and the cordon where
    remediation set it. Returns what it did, for cleanup's report."""
    from gpu_operator.controllers.units.health.machine import INITIALLY_UNSCHEDULABLE
    from gpu_operator.vocabulary import HEALTH_CONDITION, HEALTH_TAINT

    name = node["metadata"]["name"]
    done = []
    if await nodestatus.drop_condition(kube, node, HEALTH_CONDITION):
        done.append(f"removed condition {HEALTH_CONDITION}")
    # read again (under its resourceVersion) only where the listed node carries the taint
    tainted = any(t.get("key") == HEALTH_TAINT for t in (node.get("spec") or {}).get("taints") or [])
    if tainted and await nodestatus.update_taints(
        kube, name, lambda cur: [t for t in cur if t.get("key") != HEALTH_TAINT]
    ):
        done.append(f"removed taint {HEALTH_TAINT}")
    notes = node["metadata"].get("annotations") or {}
    if notes.get(INITIALLY_UNSCHEDULABLE) == "false" and (node.get("spec") or {}).get("unschedulable"):
        await kube.merge_patch("v1", "Node", name, {"spec": {"unschedulable": False}})
        done.append("uncordoned (cordoned by GPU remediation)")
    return done
