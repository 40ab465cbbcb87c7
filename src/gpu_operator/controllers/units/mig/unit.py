"""The MIG unit: watches each node's MIG change (what NVIDIA's MIG manager writes on the Node) and
repairs a node stuck in one (controllers/units/mig/rules.py decides; this unit reads and writes).

Per node it writes the NvidiaMIGReady condition, one Event when it turns stuck, failed or invalid
(also on the ClusterPolicy, whose status keeps upstream's shape) and one when that ends, its memory in our
annotations (when it first saw the change pending, its restore order, its retries: node labelling,
the deploy labels' one writer, carries out the restore order), and restarts the node's MIG manager
pod to retry a stuck or failed change (the MIG manager's watch reacts only to a change of
`nvidia.com/mig.config` or its own start). A node already as decided costs no write.

Reads besides the read model, only for nodes in or after a change: the pods on the node (its MIG
manager and the GPU clients that did not stop, in the operator's namespace; after a failed change,
the pods given GPUs that hold them; not watched: kopf's pod watch is selected to driver pods), and the layouts ConfigMap where a config may be invalid. While a
node is in a change the unit looks again every `mig_poll` seconds, and at the budget's and the
retry's deadlines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.customresources import CLUSTER_POLICY
from gpu_operator.controllers.gpuholders import requests_gpu
from gpu_operator.controllers.loop import (
    Event,
    NodeEvent,
    NodePass,
    NodeQueue,
    ObjectEvent,
    Pacing,
    Result,
    UnitBase,
)
from gpu_operator.controllers.readmodel import ReadModel
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.controllers.units.mig import rules as mr
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube import nodestatus
from gpu_operator.kube.client import Kube
from gpu_operator.kube.resources import ObjectKey
from gpu_operator.render.states.mig_manager import MIG_CONFIG as DEFAULT_LAYOUTS
from gpu_operator.render.states.mig_manager import default_mig_config
from gpu_operator.statusview.mig import TROUBLE  # the reasons a person may act on
from gpu_operator.vocabulary import (
    MIG_ANNOTATION_PREFIX,
    MIG_CLIENT_APPS,
    MIG_CONDITION,
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    MIG_EVENT_REASON,
    MIG_MANAGER,
    MIG_MANAGER_APP,
    MIG_PENDING_SINCE,
    MIG_RESTORE,
    MIG_RETRY,
)

log = logging.getLogger("gpu_operator.mig")


# How long the MIG manager waits for the GPU clients' pods to leave (mig-parted v0.15.0,
# pkg/mig/reconfigure: 5 minutes, polling each second)
MIG_MANAGER_WAIT = 300
LAYOUTS_KEY = (
    "config.yaml"  # the key of the layouts in every config ConfigMap (ours, the user's, the generated)
)


def config_names(text: str) -> tuple[str, ...] | None:
    """The config names of a mig-parted config file; None when it is no such file."""
    try:
        configs = (yaml.safe_load(text) or {}).get("mig-configs")
    except (yaml.YAMLError, AttributeError):
        return None
    return tuple(sorted(str(k) for k in configs)) if isinstance(configs, dict) else None


def _watched(view: NodeView) -> tuple[object, ...]:
    """What the unit reads of a node: a change of any of these kicks it."""
    labels = view.labels
    ours = tuple(sorted((k, v) for k, v in view.annotations.items() if k.startswith(MIG_ANNOTATION_PREFIX)))
    return (
        labels.get(MIG_CONFIG),
        labels.get(MIG_CONFIG_STATE),
        mr.paused_labels(labels),
        labels.get(MIG_MANAGER),
        ours,
        view.mig_condition,
    )


# How long a write of the unit waits for its echo in the Node view before it may be written again
ECHO_WAIT = 15.0


@dataclass(frozen=True)
class Sent:
    """What the unit last wrote to a node (its decision's key, the condition, the annotations), and when."""

    key: tuple[object, ...]
    condition: tuple[str, str, str] | None
    notes: dict[str, str | None]
    at: float

    def echoed(self, view: NodeView) -> bool:
        """The node's view shows the write: its echo came."""
        return view.mig_condition == self.condition and all(
            view.annotations.get(k) == v for k, v in self.notes.items()
        )


@dataclass
class MIGPassReport(NodePass):
    """What one pass wrote (for logs and tests)."""

    notes: int = 0
    retries: int = 0


class MIGUnit(UnitBase):
    name = "mig"
    pacing = Pacing.IDLE_FIRST

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        model: ReadModel,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.settings, self.model, self.clock = kube, settings, model, clock
        self.queue = NodeQueue(_watched)
        self._active: set[str] = set()  # nodes in or after a change: looked at on every pass
        # node -> the mig.config the unit saw applied, the state not moved since (memory only)
        self._applied: dict[str, str] = {}
        self._held: dict[
            str, tuple[str, float]
        ] = {}  # node -> (new mig.config, since) while its success is stale
        self._sent: dict[str, Sent] = {}  # node -> the unit's last write, until its echo shows in the view
        self._everything = True
        if settings.mig_change_budget < MIG_MANAGER_WAIT:
            log.warning(
                "mig_change_budget %g s is below the MIG manager's %d s wait for the GPU clients to stop: "
                "a change may be found stuck while the MIG manager still waits",
                settings.mig_change_budget,
                MIG_MANAGER_WAIT,
            )

    # -- the queue

    def wants(self, event: Event) -> bool:
        if isinstance(event, NodeEvent):
            if event.view is None:
                self._active.discard(event.name)
                self._applied.pop(event.name, None)
                self._held.pop(event.name, None)
                self._sent.pop(event.name, None)
            return self.queue.changed(event)
        if isinstance(event, ObjectEvent) and event.of(CLUSTER_POLICY):
            self._everything = True
            return True
        return False

    def failed(self, err: BaseException) -> None:
        self._everything = True

    # -- one pass

    async def reconcile(self) -> Result:
        everything, names = self._everything, self.queue.take()
        self._everything = False
        report = MIGPassReport()
        policy = self.model.active_model()
        if policy is None:
            return report  # no policy deploys a MIG manager: nothing to decide by
        views = (
            {v.name: v for v in self.model.nodes()}
            if everything
            else {n: v for n in names | self._active if (v := self.model.node(n)) is not None}
        )
        now = self.clock()
        layouts: dict[str, tuple[str, tuple[str, ...] | None]] = {}
        wakes: list[float] = []

        async def one(name: str) -> None:
            wake = await self._node(views[name], policy, now, layouts, report)
            if wake is not None:
                wakes.append(wake)

        await self.queue.each(views, self.settings.mig_concurrency, one, report, "MIG repair failed", log)
        report.looked = len(views)
        if report.failed:
            wakes.append(now + self.settings.health_retry)
        if self._active:
            wakes.append(now + self.settings.mig_poll)
        if wakes:
            report.requeue = max(0.0, min(wakes) - now)
        return report

    async def _node(
        self,
        view: NodeView,
        policy: ClusterPolicy,
        now: float,
        layouts: dict[str, tuple[str, tuple[str, ...] | None]],
        report: MIGPassReport,
    ) -> float | None:
        labels, notes = view.labels, view.annotations
        state = labels.get(MIG_CONFIG_STATE)
        pods = await self._pods(view.name) if mr.needs_pods(labels, notes) else None
        attempts, retry_from = mr.parse_retry(notes.get(MIG_RETRY))
        since, since_config = mr.parse_since(notes.get(MIG_PENDING_SINCE))
        config = labels.get(MIG_CONFIG)
        layout_name, valid = ("", None)
        # the config's name is checked where the MIG manager failed it, or before it acted on one that
        # is not the operator's default (all-disabled is in every config file the operator renders
        # and NVIDIA generates): a fleet's first labelling costs no read per node
        if (
            config is not None
            and not mr.paused_labels(labels)
            and (state == mr.FAILED or (state is None and config != "all-disabled"))
        ):
            layout_name, valid = await self._layouts(view.name, policy, layouts)
        facts = mr.MIGFacts(
            view.name,
            config,
            state,
            mr.paused_labels(labels),
            self._manager(view, policy, pods),
            pending_since=since,
            pending_config=since_config,
            restore=notes.get(MIG_RESTORE),
            attempts=attempts,
            retry_from=retry_from,
            valid=valid,
            layouts=layout_name,
            clients=self._clients(pods),
            holders=self._holders(pods) if state == mr.FAILED else (),
        )
        decision = mr.decide(facts, now, self.settings.mig_change_budget, self.settings.mig_retry_backoff)
        held = mr.hold_stale_success(
            decision,
            config,
            self._applied.get(view.name),
            self._held.get(view.name),
            now,
            self.settings.mig_poll,
        )
        if held is not None:  # the MIG manager has not acted on the new config yet: nothing to write
            self._held[view.name] = held
            self._active.add(view.name)
            return held[1] + self.settings.mig_poll
        self._held.pop(view.name, None)
        if decision.kind is mr.Verdict.APPLIED and config is not None:
            self._applied[view.name] = config
        else:  # the state moved since: a later success is the MIG manager's answer, not a stale one
            self._applied.pop(view.name, None)
        if decision.kind in (mr.Verdict.IN_PROGRESS, mr.Verdict.STUCK, mr.Verdict.FAILED):
            self._active.add(view.name)
        else:
            self._active.discard(view.name)
        sent = self._sent.get(view.name)
        key = (decision.condition, tuple(sorted(decision.notes)))
        if sent is not None and (sent.echoed(view) or now >= sent.at + ECHO_WAIT):
            del self._sent[view.name]
        elif sent is not None and sent.key == key and not decision.retry:
            # what this unit wrote a moment ago, decided again from a view its echo has not reached yet
            # (another writer's change of the node came first): no second write
            return min(w for w in (decision.wake, sent.at + ECHO_WAIT) if w is not None)
        if decision.notes and (decision.condition is None or decision.condition == view.mig_condition):
            await self.kube.merge_patch(
                "v1", "Node", view.name, {"metadata": {"annotations": decision.notes}}
            )
            report.notes += 1
            await self._condition(view, decision, report)
            wrote = True
        else:  # the annotations go with the condition's write: one request
            wrote = await self._condition(view, decision, report, notes=decision.notes)
            report.notes += bool(decision.notes)
        if wrote:
            self._sent[view.name] = Sent(key, decision.condition, dict(decision.notes), now)
        if decision.retry:
            await self._restart_manager(view.name, pods or [])
            report.retries += 1
        return decision.wake

    # -- reads

    async def _pods(self, node: str) -> list[dict[str, Any]]:
        """The pods on the node, every namespace's: ours (the MIG manager, the GPU clients) and those
        given GPUs, which hold them."""
        return await self.kube.list_pods(None, fields=f"spec.nodeName={node}")

    def _app(self, pod: dict[str, Any]) -> str:
        """The app label of a pod in the operator's namespace ("" for any other pod)."""
        meta = pod.get("metadata") or {}
        return (
            str((meta.get("labels") or {}).get("app", ""))
            if meta.get("namespace") == self.model.namespace
            else ""
        )

    @staticmethod
    def _holders(pods: list[dict[str, Any]] | None) -> tuple[str, ...]:
        """Running pods given GPUs (not being deleted), namespace/name: a MIG change waits for them."""
        return tuple(
            sorted(
                f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
                for p in pods or ()
                if requests_gpu(p)
                and (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            )
        )

    def _manager(
        self, view: NodeView, policy: ClusterPolicy, pods: list[dict[str, Any]] | None
    ) -> mr.ManagerPresence:
        if pods is not None and any(
            self._app(p) == MIG_MANAGER_APP and not p["metadata"].get("deletionTimestamp") for p in pods
        ):
            return mr.ManagerPresence.RUNNING
        if policy.spec.migManager.on() and view.labels.get(MIG_MANAGER) == "true":
            return mr.ManagerPresence.GONE
        return mr.ManagerPresence.NOT_DEPLOYED

    def _clients(self, pods: list[dict[str, Any]] | None) -> tuple[str, ...]:
        return tuple(
            sorted(
                f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
                for p in pods or ()
                if self._app(p) in MIG_CLIENT_APPS
            )
        )

    async def _layouts(
        self, node: str, policy: ClusterPolicy, seen: dict[str, tuple[str, tuple[str, ...] | None]]
    ) -> tuple[str, tuple[str, ...] | None]:
        """(ConfigMap, its config names) the node's MIG manager selects from: the policy's
        migManager.config.name; else the config it generated from the node's GPUs and published
        (`<node>-mig-config`), else ours (`default-mig-parted-config`). Names None: unreadable."""
        config = policy.spec.migManager.config
        custom = config.name if config is not None and config.name else None
        name = custom or f"{node}-mig-config"
        if name not in seen:
            found = await self.kube.get_dict("v1", "ConfigMap", name, namespace=self.model.namespace)
            text = None if found is None else (found.get("data") or {}).get(LAYOUTS_KEY)
            seen[name] = (name, config_names(str(text)) if text is not None else None)
        if custom or seen[name][1] is not None:
            return seen[name]
        return DEFAULT_LAYOUTS, config_names(default_mig_config())

    # -- writes

    async def _condition(
        self,
        view: NodeView,
        d: mr.MIGDecision,
        report: MIGPassReport,
        notes: dict[str, str | None] | None = None,
    ) -> bool:
        """Write the condition where it changed (with `notes` in the same request); True if written."""
        want = d.condition
        have = view.mig_condition
        if want == have:
            return False
        if want is None:
            await nodestatus.delete_condition(self.kube, view.name, MIG_CONDITION)
            report.conditions += 1
            return True
        status, reason, message = want
        await nodestatus.set_condition(
            self.kube,
            view.name,
            MIG_CONDITION,
            status,
            reason,
            message,
            moved=have is None or have[0] != status,
            annotations=notes,
        )
        report.conditions += 1
        if have is None or have[1] != reason:
            log.info("node %s: %s: %s", view.name, reason, message)
        # an Event where a person may need to act, and when that ends: not for every change started or
        # applied (a fleet's first pass would post one per MIG node)
        if (have is None or have[1] != reason) and (
            reason in TROUBLE or (have is not None and have[1] in TROUBLE)
        ):
            warning = reason in TROUBLE
            await self.kube.node_event(view.name, MIG_EVENT_REASON, f"{reason}: {message}", warning=warning)
            report.events += 1
            source = self.model.active_policy()
            if warning and source is not None:
                # the policy's status keeps upstream's shape (state, Ready/Error): its Events say it
                await self.kube.event(
                    {
                        "apiVersion": "nvidia.com/v1",
                        "kind": "ClusterPolicy",
                        "name": source.name,
                        "uid": source.uid,
                    },
                    MIG_EVENT_REASON,
                    f"node {view.name}: {reason}: {message}",
                )
                report.events += 1
        return True

    async def _restart_manager(self, node: str, pods: list[dict[str, Any]]) -> None:
        """The retry: the node's MIG manager pod deleted; its DaemonSet starts a new one, whose
        start runs the node's `nvidia.com/mig.config` again."""
        for pod in pods:
            if self._app(pod) == MIG_MANAGER_APP and not pod["metadata"].get("deletionTimestamp"):
                meta = pod["metadata"]
                log.info(
                    "node %s: retrying its MIG change: restarting %s/%s",
                    node,
                    meta.get("namespace"),
                    meta["name"],
                )
                await self.kube.delete(
                    ObjectKey("v1", "Pod", meta["name"], meta.get("namespace") or self.model.namespace)
                )


async def take_back(kube: Kube, node: dict[str, Any]) -> list[str]:
    """What uninstall cleanup must undo of the MIG unit on one node (our annotations go with the
    operator's other keys): the NvidiaMIGReady condition. Returns what it did, for cleanup's report."""
    return (
        [f"removed condition {MIG_CONDITION}"]
        if await nodestatus.drop_condition(kube, node, MIG_CONDITION)
        else []
    )
