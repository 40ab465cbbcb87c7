"""The operator's tunables in one typed object (`gpu-operator run` builds it from its options), and
the capped exponential backoff every retry in the operator uses."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff: `initial`, then doubled per consecutive failure, never above `cap`."""

    initial: float = 1.0
    """Seconds before the first retry."""
    cap: float = 60.0
    """The longest wait between two retries, however many failures came before."""

    def delay(self, failures: int) -> float:
        """The wait after `failures` consecutive failures (1 = the first failure)."""
        exponent = max(0, failures - 1)
        if exponent >= 64:  # 2**64 seconds is past any cap
            return self.cap
        return float(min(self.cap, self.initial * 2.0**exponent))


@dataclass(frozen=True)
class OperatorSettings:
    """Everything `gpu-operator run` can tune, with its defaults. Times are in seconds."""

    coalesce: float = 0.1
    """Kicks (watch events) arriving within this window are served by one reconcile pass. A
    ClusterPolicy reconcile also waits at least twice as long as the previous one took. The
    labelling loop waits only under load: twice as long as its last pass took, at most this."""

    labels_first_limit: float = 60.0
    """A new ClusterPolicy's labels go first: its reconcile (which creates the operands'
    DaemonSets) waits while the labelling loop has not yet looked at this version of the policy
    or runs the fleet-wide pass it started, but never longer than this."""

    requeue_not_ready: float = 5.0
    """A ClusterPolicy or NVIDIADriver whose operands are not ready is reconciled again after this
    (besides every watch event that concerns it)."""

    status_message_hold: float = 5.0
    """While a ClusterPolicy stays not ready for the same reason, a new message (which states are
    not ready moves with every DaemonSet's numbers while nodes join) is written at most this often;
    the pass at the end of the hold writes the latest. A change of state or reason is written at once."""

    requeue_conflict: float = 60.0
    """A GPUCluster beside a ClusterPolicy (which cannot run together) is looked at again after this
    (besides every event of either)."""

    gpucluster_resync: float = 60.0
    """A ready GPUCluster is looked at again after this, and the objects of kinds the operator does
    not watch (DeviceClasses, the ResourceSlice admission policy, claim templates) are read back:
    one someone deleted or changed is applied again (reads only while nothing changed)."""

    claim_recheck: float = 30.0
    """Node labelling looks again this often at nodes that keep the DRA driver label only because a
    pod there still holds a gpu.nvidia.com ResourceClaim (leaving the DRA stack)."""

    requeue_no_nfd: float = 45.0
    """A ClusterPolicy on a cluster without NFD labels is reconciled again after this."""

    requeue_kubevirt: float = 30.0
    """With sandbox workloads on, a ready ClusterPolicy is reconciled again after this: the KubeVirt
    CR is not watched, so an edit there (or a new KubeVirt install) is seen within this time."""

    upgrade_active_requeue: float = 2.0
    """Between two driver-upgrade passes while any node is between upgrade states (cordoned,
    drained, its driver pod restarting, being validated)."""

    upgrade_idle_requeue: float = 600.0
    """Between two driver-upgrade passes while no node is between upgrade states, when nothing
    kicked one. Every input of such a pass is watched (driver pods, our DaemonSets, nodes' upgrade
    labels, annotations, cordon and readiness, the ClusterPolicy and NVIDIADrivers), so this is a
    resync against a missed event only. Upstream polls every 2 minutes, which at 5,000 nodes lists
    every driver pod for nothing."""

    upgrade_view_wait: float = 0.5
    """A driver-upgrade pass whose node views do not show its own last patches yet (the Node watch
    lags) waits this long and looks again before planning."""

    upgrade_view_lag_limit: float = 30.0
    """How long a pass waits for the Node watch to show its patches before it plans anyway (and
    logs that the watch lags)."""

    upgrade_concurrency: int = 32
    """Pod evictions and deletions in flight at once during driver upgrades."""

    health_concurrency: int = 16
    """GPU health: nodes whose condition, taints or remediation step are written at once."""

    health_retry: float = 5.0
    """GPU health: a node whose write failed is looked at again after this."""

    health_poll: float = 10.0
    """GPU health: between two passes while any node is in remediation (drain and validation
    timeouts, pods going away), besides every event that concerns it."""

    mig_change_budget: float = 600.0
    """MIG: how long a node's MIG change may stay pending (from when the operator first saw it) before
    the node counts as stuck: its paused GPU clients are restored and the change is retried. Keep it
    above the MIG manager's own 5-minute wait for the GPU clients to stop."""

    mig_retry_backoff: Backoff = field(default_factory=lambda: Backoff(initial=60.0, cap=1800.0))
    """MIG: a stuck or failed change is retried (the node's MIG manager pod restarted) once its GPU
    clients are back and this backoff has passed: 60 s, 120 s ... up to 30 min; a success resets it."""

    mig_concurrency: int = 16
    """MIG: nodes looked at and written (annotations, condition, a MIG manager pod restarted) at once."""

    mig_poll: float = 30.0
    """MIG: between two looks at a node in a MIG change, besides every event of the node (its MIG
    manager's pod is not watched: a pod gone is seen within this)."""

    reconcile_backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, cap=60.0))
    """Retries of a pass that raised (API errors, network), for every unit but node labelling
    (label_backoff): 1 s, 2 s, 4 s ... up to 60 s; the first success resets it. Not-ready policies requeue on their
    own schedule (5 s; 45 s without NFD labels), which is not an error."""

    label_backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, cap=300.0))
    """Per node: a label patch that failed (403, 409, 5xx ...) is retried for that node only,
    after 1 s, 2 s, 4 s ... up to 5 min; other nodes and the ClusterPolicy loop are not woken.
    A node event (its labels changed) or a changed policy retries it at once."""

    label_concurrency: int = 32
    """Node label patches in flight at once."""

    gfd_node_labels: bool = True
    """Node labelling puts GPU feature discovery's `nvidia.com/` labels (its NodeFeature objects in
    the operator's namespace) on the Nodes, as NFD's master would, and removes exactly those it
    wrote once GFD no longer runs there. Off where NFD runs (the chart's `nfd.enabled=false`): then
    NFD's master is their one writer and the operator writes none of them."""

    leader_lease_duration: float = 15.0
    """How long a Lease stays ours after the last renewal (written into the Lease)."""

    leader_renew_deadline: float = 10.0
    """A leader that could not renew for this long steps down (stops the process)."""

    leader_retry_period: float = 2.0
    """Between two attempts to take or renew the Lease."""

    discovery_backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, cap=30.0))
    """Start-up discovery (the Kubernetes version, the ServiceMonitor CRD) is retried with this
    backoff until it answers; the operator does not start its loops (and is not ready) before."""

    apiserver_probe_period: float = 3.0
    """Between two GETs of the apiserver's /readyz; two misses in a row make the operator's own
    /readyz answer 503 until the apiserver answers again."""

    api_error_backoffs: tuple[float, ...] = (0.5, 1.0, 1.0, 2.0, 2.0, 2.0)
    """kopf's retries of a failed watch or list request (connection refused, 5xx), in seconds. A
    watch whose retries are used up starts over at once, so an apiserver that comes back is seen
    within about 2 s (kopf's own default climbs to 21 s: a restart went unnoticed for >10 s)."""

    watch_server_timeout: float = 300
    """Asked of the apiserver per watch request: it ends the watch after this, kopf restarts it."""

    watch_client_timeout: float = 310
    """The client gives up on a watch request that has not ended after this."""

    watch_connect_timeout: float = 30
    """Connecting for a watch request."""

    watch_backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, cap=2.0))
    """The Node reflector's retries after a failed list or watch request (it resumes from the last
    resourceVersion it saw; a 410 Gone answer lists again at once). Capped at 2 s, as kopf's
    watches (`api_error_backoffs`): one request per 2 s during an outage costs nothing, and a
    longer cap left a returning apiserver unseen for up to the cap (16 s after a 20 s outage)."""

    watch_chunk_size: int = 500
    """Objects per page when a watch first lists its kind."""

    watch_worker_idle: float = 0.5
    """How long kopf keeps an object's event worker after its last event (kopf's default: 5 s).
    An idle worker still holds the whole decoded body of the last event it handled: during a
    rollout at 5,000 nodes that was ~24 MB of driver-pod and DaemonSet bodies held at the peak
    (peak RSS 158 -> 125 MB with 0.5 s, bench/README.md). Our handlers only slim the body into
    an index and set flags, so a new worker per burst costs nothing."""

    @classmethod
    def with_renew_deadline(cls, renew_deadline: float, **changes: Any) -> OperatorSettings:
        """The CLI's `--leader-lease-renew-deadline`: the Lease lasts 5 s longer than the deadline."""
        return replace(
            cls(leader_renew_deadline=renew_deadline, leader_lease_duration=renew_deadline + 5), **changes
        )
