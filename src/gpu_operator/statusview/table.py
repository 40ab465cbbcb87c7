"""Pure: nodes, DaemonSets, pods and ClusterPolicies (as dicts) -> the GPU nodes x components view."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_operator.kube.crdowners import LeftCRD
from gpu_operator.render.facts import has_nfd_gpu_labels as has_gpu
from gpu_operator.statusview.health import NodeHealth, node_health
from gpu_operator.statusview.health import problems as health_problems
from gpu_operator.statusview.mig import NodeMIG, node_mig
from gpu_operator.statusview.mig import problems as mig_problems
from gpu_operator.statusview.operatorpods import operator_problems
from gpu_operator.statusview.upgrades import NodeUpgrade, node_upgrade
from gpu_operator.statusview.upgrades import problems as upgrade_problems
from gpu_operator.vocabulary import (
    DEPLOY_PREFIX,
    GPU_PRESENT,
    NO_GPU_NODES,
    STATE_LABELS,
    VM_PASSTHROUGH_CONDITION,
)

# Column order: the states' order in upstream's walk, then anything else alphabetically.
_ORDER = [label.removeprefix(DEPLOY_PREFIX) for labels in STATE_LABELS.values() for label in labels]
_ORDER.insert(_ORDER.index("node-status-exporter"), "mig-manager")
CANONICAL_ORDER = list(dict.fromkeys(_ORDER))


@dataclass(frozen=True)
class Cell:
    """One component on one node: its deploy label and the state of its operand pod(s) there."""

    label: str | None  # value of nvidia.com/gpu.deploy.<component>; None when absent
    pod: str = ""  # phase of the DaemonSet pod(s) on the node ("" when none is expected)
    ready: bool | None = None  # None: nothing is expected to run here
    detail: str = ""  # why it is not ready

    @property
    def expected(self) -> bool:
        return self.ready is not None


@dataclass(frozen=True)
class NodeRow:
    name: str
    cells: dict[str, Cell]
    validation: str = ""  # the validator pod's progress through its *-validation init containers
    upgrade: NodeUpgrade | None = None  # driver upgrade state, reason and time in state
    stack: str = ""  # "dra" (GPUCluster labels), "device-plugin" (ClusterPolicy labels) or "" (none yet)
    health: NodeHealth | None = None  # the NvidiaGPUReady condition and remediation state
    mig: NodeMIG | None = None  # the MIG config, its state and the NvidiaMIGReady condition

    @property
    def ready(self) -> bool:
        return all(c.ready is not False for c in self.cells.values())


@dataclass(frozen=True)
class PolicySummary:
    name: str
    state: str  # status.state: ready | notReady | ignored | "" (not reconciled yet)
    reason: str = ""
    message: str = ""
    ignored: tuple[str, ...] = ()  # other ClusterPolicies: only the oldest one is active
    vm_problem: str = ""  # the VMPassthrough condition when False: "reason: message"
    kind: str = "ClusterPolicy"  # or GPUCluster (the DRA stack)
    conflict: str = ""  # a GPUCluster beside the ClusterPolicy (they cannot run together)


@dataclass
class StatusView:
    namespace: str | None
    components: list[str]
    rows: list[NodeRow]
    policy: PolicySummary | None
    other_nodes: int = 0  # nodes without a GPU (not shown)
    problems: list[str] = field(default_factory=list)
    operator: list[str] = field(
        default_factory=list
    )  # the chart's own pods that cannot run (operatorpods.py)
    crds: list[LeftCRD] = field(default_factory=list)  # CRDs we ship that another Helm release owns
    platform: str = ""  # "OpenShift 4.17" where the cluster is one (kube/platform.py); "" elsewhere

    @property
    def policy_behind(self) -> bool:
        """The policy says there is no GPU node while there are: its last reconcile predates them."""
        return self.policy is not None and self.policy.reason == NO_GPU_NODES and bool(self.rows)

    @property
    def ready(self) -> bool:
        return (
            self.policy is not None
            and self.policy.state == "ready"
            and not self.policy_behind
            and not self.operator
            and all(row.ready for row in self.rows)
        )

    def counts(self) -> tuple[int, int]:
        """(operand pods ready, operand pods expected) over every shown cell."""
        cells = [c for row in self.rows for c in row.cells.values() if c.expected]
        return sum(1 for c in cells if c.ready), len(cells)


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def is_gpu_node(node: dict[str, Any]) -> bool:
    labels = _labels(node)
    return labels.get(GPU_PRESENT) == "true" or has_gpu(labels)


def components_of(daemonset: dict[str, Any]) -> list[str]:
    """The components whose deploy label gates this DaemonSet (its nodeSelector keys)."""
    selector = ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
    return [key.removeprefix(DEPLOY_PREFIX) for key in selector if key.startswith(DEPLOY_PREFIX)]


def selects(daemonset: dict[str, Any], node: dict[str, Any]) -> bool:
    """Whether the DaemonSet's pods go to `node`: its nodeSelector and its required node affinity
    (the operator splits one operand over DaemonSets by affinity: a toolkit per runtime, a driver
    for VM guests whose NVLink fabric is missing)."""
    spec = daemonset["spec"]["template"]["spec"]
    labels = _labels(node)
    if not all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": _name(node)}
    # the terms are ORed, the requirements within a term ANDed (a term without any matches nothing)
    return any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_requirement(r, labels) for r in term.get("matchExpressions") or [])
        and all(_requirement(r, fields) for r in term.get("matchFields") or [])
        for term in terms
    )


def _requirement(req: dict[str, Any], values: dict[str, str]) -> bool:
    """One node selector requirement (In, NotIn, Exists, DoesNotExist; Gt, Lt on integers)."""
    key, op, wanted = req.get("key", ""), req.get("operator"), [str(v) for v in req.get("values") or []]
    have = values.get(key)
    if op == "In":
        return have in wanted
    if op == "NotIn":
        return have not in wanted
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and wanted:
        try:
            return int(have) > int(wanted[0]) if op == "Gt" else int(have) < int(wanted[0])
        except ValueError:
            return False
    return False


def pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )


def pod_problem(pod: dict[str, Any]) -> str:
    """The most specific reason a pod is not ready: a waiting/failed container (its termination
    message first: the validator writes its failure there), an init container still at work (a
    validator waiting for what it checks), else a condition (the kubelet's generic "containers
    with incomplete status" only when no container says more)."""
    status = pod.get("status") or {}
    running_init = ""
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = status.get(key) or []
        for index, cs in enumerate(statuses):
            state = cs.get("state") or {}
            last = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            said = (
                f": {last['message'].strip()[:300]}"
                if last.get("exitCode", 0) != 0 and last.get("message")
                else ""
            )
            waiting = state.get("waiting") or {}
            if "waiting" in state and waiting.get("reason") not in (None, "PodInitializing"):
                told = said or (
                    f": {' '.join(str(waiting['message']).split())[:300]}" if waiting.get("message") else ""
                )
                return f"{cs['name']}: {waiting['reason']}{told}"
            terminated = state.get("terminated")
            if terminated and terminated.get("exitCode", 0) != 0:
                return f"{cs['name']}: exited {terminated['exitCode']} ({terminated.get('reason', '')}){said}"
            if said and "running" in state:  # restarted: its last run's failure is still the reason
                return f"{cs['name']}: running again after exit {last['exitCode']}{said}"
            if key == "initContainerStatuses" and "running" in state and not running_init:
                running_init = (
                    f"{cs['name']}: init container {index + 1} of {len(statuses)} still running, "
                    f"not passed yet (its log says what it waits for: kubectl logs <pod> -c {cs['name']})"
                )
    if running_init:
        return running_init
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True" and cond.get("message"):
            return f"{cond['type']}: {cond['message']}"
    return status.get("reason") or status.get("phase") or "unknown"


def validation_state(pod: dict[str, Any] | None) -> str:
    """Where a validator pod stands in its chain of *-validation init containers."""
    if pod is None:
        return ""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if not statuses:
        return "ready" if pod_ready(pod) else "pending"
    for cs in statuses:
        terminated = (cs.get("state") or {}).get("terminated")
        if not terminated:
            return f"waiting: {cs['name']}"
        if terminated.get("exitCode", 0) != 0:
            return f"failed: {cs['name']}"
    return f"passed ({len(statuses)}/{len(statuses)})"


def node_stack(labels: dict[str, str]) -> str:
    """Which stack's labels a node carries: the DRA stack's or the device plugin's."""
    if labels.get(DEPLOY_PREFIX + "dra-driver"):
        return "dra"
    if any(
        labels.get(DEPLOY_PREFIX + c)
        for c in ("device-plugin", "sandbox-device-plugin", "kata-sandbox-device-plugin")
    ):
        return "device-plugin"
    return ""


def _policy_summary(policies: list[dict[str, Any]], clusters: list[dict[str, Any]]) -> PolicySummary | None:
    if not policies and not clusters:
        return None
    if not policies:
        return replace(_summary_of(clusters), kind="GPUCluster")
    return replace(_summary_of(policies), conflict=_name(clusters[0]) if clusters else "")


def _summary_of(policies: list[dict[str, Any]]) -> PolicySummary:
    ordered = sorted(policies, key=lambda p: (p["metadata"].get("creationTimestamp", ""), _name(p)))
    active = ordered[0]
    status = active.get("status") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    error: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Error"), {})
    failing = error if error.get("status") == "True" else ready
    vm: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == VM_PASSTHROUGH_CONDITION), {}
    )
    vm_problem = f"{vm.get('reason', '')}: {vm.get('message', '')}" if vm.get("status") == "False" else ""
    return PolicySummary(
        _name(active),
        str(status.get("state", "")),
        str(failing.get("reason", "")),
        str(failing.get("message", "")),
        tuple(_name(p) for p in ordered[1:]),
        vm_problem,
    )


def _order(components: Iterable[str]) -> list[str]:
    known = [c for c in CANONICAL_ORDER if c in components]
    return known + sorted(set(components) - set(known))


def build_view(
    nodes: list[dict[str, Any]],
    daemonsets: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    policies: list[dict[str, Any]],
    namespace: str | None = None,
    clusters: list[dict[str, Any]] | None = None,
    operator_pods: list[dict[str, Any]] | None = None,
) -> StatusView:
    """The GPU nodes x components view and the reasons for anything not ready; `operator_pods`:
    the chart's own pods (by their component label, operatorpods.ROLES), whose failures to start
    come first."""
    gpu_nodes = sorted((n for n in nodes if is_gpu_node(n)), key=_name)
    by_component: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ds in daemonsets:
        for component in components_of(ds):
            by_component[component].append(ds)
    owner_uid = {ds["metadata"].get("uid"): ds for ds in daemonsets}
    pods_by: dict[tuple[str, str], dict[str, Any]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("uid") in owner_uid and node_name:
                pods_by[(_name(owner_uid[ref["uid"]]), node_name)] = pod
    labelled = {
        key.removeprefix(DEPLOY_PREFIX)
        for n in gpu_nodes
        for key in _labels(n)
        if key.startswith(DEPLOY_PREFIX)
    }
    components = _order(labelled | set(by_component))

    rows = []
    for node in gpu_nodes:
        cells = {c: _cell(node, c, by_component.get(c, []), pods_by) for c in components}
        validator = next(
            (
                pods_by.get((_name(ds), _name(node)))
                for c in components
                if c.endswith("validator")
                for ds in by_component.get(c, [])
                if (_name(ds), _name(node)) in pods_by
            ),
            None,
        )
        rows.append(
            NodeRow(
                _name(node),
                cells,
                validation_state(validator),
                node_upgrade(node),
                node_stack(_labels(node)),
                node_health(node),
                node_mig(node),
            )
        )
    view = StatusView(
        namespace,
        components,
        rows,
        _policy_summary(policies, clusters or []),
        other_nodes=len(nodes) - len(gpu_nodes),
        operator=operator_problems(operator_pods or []),
    )
    view.problems = view.operator + problems(view)
    return view


def _cell(
    node: dict[str, Any],
    component: str,
    daemonsets: list[dict[str, Any]],
    pods_by: dict[tuple[str, str], dict[str, Any]],
) -> Cell:
    label = _labels(node).get(DEPLOY_PREFIX + component)
    targeting = [ds for ds in daemonsets if selects(ds, node)]
    if label != "true" or not targeting:
        return Cell(label)
    phases, details = [], []
    for ds in targeting:
        pod = pods_by.get((_name(ds), _name(node)))
        if pod is None:
            phases.append("no pod")
            details.append(f"no pod of DaemonSet {_name(ds)} yet")
            continue
        phases.append(str((pod.get("status") or {}).get("phase") or "Unknown"))
        if not pod_ready(pod):
            details.append(f"pod {_name(pod)}: {pod_problem(pod)}")
    return Cell(label, "/".join(dict.fromkeys(phases)), not details, "; ".join(details))


def problems(view: StatusView, examples: int = 3) -> list[str]:
    """Reasons for everything not ready, grouped so that a thousand nodes read as one line."""
    out: list[str] = []
    policy = view.policy
    if policy is None:
        out.append(
            "no ClusterPolicy or GPUCluster: create one (e.g. examples/clusterpolicy-default.yaml, or "
            "examples/gpucluster.yaml for the DRA stack)"
        )
    elif policy.state != "ready":
        state = policy.state or "not reconciled yet"
        why = f" ({policy.reason}: {policy.message})" if policy.reason or policy.message else ""
        out.append(f"{policy.kind} {policy.name}: {state}{why}")
    if policy is not None and policy.conflict:
        out.append(
            f"GPUCluster {policy.conflict} exists beside ClusterPolicy {policy.name}: they cannot run "
            "together; delete one of them"
        )
    if view.policy_behind:
        out.append(
            f"{policy.kind if policy else 'ClusterPolicy'} {policy.name if policy else ''}: {NO_GPU_NODES} while {len(view.rows)} "
            "GPU node(s) exist: the operator has not reconciled since they appeared"
        )
    if policy is not None and policy.ignored:
        out.append(
            f"ClusterPolicy {', '.join(policy.ignored)} ignored: only the oldest one "
            f"({policy.name}) is active"
        )
    if policy is not None and policy.vm_problem:
        out.append(f"VM passthrough: {policy.vm_problem}")
    if not view.rows:
        out.append("no GPU node: none carries nvidia.com/gpu.present=true or an NFD pci-10de label")
    out.extend(upgrade_problems([r.upgrade for r in view.rows if r.upgrade is not None]))
    out.extend(health_problems([r.health for r in view.rows if r.health is not None]))
    out.extend(mig_problems([r.mig for r in view.rows if r.mig is not None]))
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in view.rows:
        for component, cell in row.cells.items():
            if cell.ready is False:
                reason = cell.detail.split(": ", 1)[-1] if cell.detail.startswith("pod ") else cell.detail
                grouped[(component, reason)].append(row.name)
    for (component, reason), names in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        more = f" and {len(names) - examples} more" if len(names) > examples else ""
        out.append(
            f"{component} not ready on {len(names)} node(s) ({', '.join(names[:examples])}{more}): {reason}"
        )
    return out
