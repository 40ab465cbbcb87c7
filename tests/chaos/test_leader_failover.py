"""Leader failover between two real operator replicas, timed, and the write fence of a paused
leader, checked in the apiserver's audit log. Each replica authenticates as its own
ServiceAccount so the audit log tells their writes apart."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from gpu_operator.controllers.leader import LEASE_NAME
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.audit import status_code
from tests.support.chaos import epoch, readyz, writes_by
from tests.support.faultproxy import FaultProxy
from tests.support.status import reconciled
from tests.support.waiting import wait_for

Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
LEASE_SECONDS = 15.0  # the default lease duration (OperatorSettings.leader_lease_duration)


def replica_kubeconfig(control_plane: ControlPlane, kube: Client, namespace: str, name: str) -> Path:
    """A kubeconfig for ServiceAccount namespace/name with cluster-admin (the test's own grant;
    the chart's RBAC is tested elsewhere), so its writes carry its own user in the audit log."""
    config = control_plane.serviceaccount_kubeconfig(namespace, name)
    binding = ClusterRoleBinding(
        metadata=ObjectMeta(name=f"chaos-{namespace}-{name}"),
        roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"),
        subjects=[Subject(kind="ServiceAccount", name=name, namespace=namespace)],
    )
    try:
        kube.create(binding)
    except ApiError as err:
        if err.status.code != 409:
            raise
    return config


def user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def holder(kube: Client, namespace: str) -> str:
    try:
        return str(kube.get(Lease, LEASE_NAME, namespace=namespace).spec.holderIdentity or "")
    except ApiError as err:
        if err.status.code == 404:
            return ""
        raise


def lease_reads(control_plane: ControlPlane, username: str) -> int:
    """How many GETs of the leader Lease by `username` the apiserver has answered."""
    return sum(
        1
        for e in control_plane.audit_all()
        if e.get("user", {}).get("username") == username
        and e.get("verb") == "get"
        and e.get("stage") == "ResponseComplete"
        and (e.get("objectRef") or {}).get("resource") == "leases"
        and (e.get("objectRef") or {}).get("name") == LEASE_NAME
    )


def labelled(kube: Client, node: str) -> bool:
    return (kube.get(Node, node).metadata.labels or {}).get(DEPLOY_DRIVER) == "true"


def two_replicas(
    kube: Client, control_plane: ControlPlane, namespace: str, start_operator: Start, args: list[str]
) -> tuple[OperatorProcess, OperatorProcess]:
    """Replica a leads (and has reconciled); replica b runs as a follower."""
    first = start_operator(
        leader_elect=True,
        extra_args=args,
        kubeconfig=replica_kubeconfig(control_plane, kube, namespace, "replica-a"),
    )
    reconciled(kube, context=first.log_text)
    second = start_operator(
        leader_elect=True,
        extra_args=args,
        kubeconfig=replica_kubeconfig(control_plane, kube, namespace, "replica-b"),
    )
    wait_for(
        "replica b waiting for the lease",
        lambda: "waiting for lease" in second.log_text(),
        timeout=30,
        context=second.log_text,
    )
    assert "became the leader" in first.log_text() and "became the leader" not in second.log_text()
    # The standby is Ready (to take over): a rolling update waits for that before stopping the leader.
    wait_for(
        "replica b's /readyz 200 while it waits",
        lambda: readyz(second),
        until=lambda c: c == 200,
        timeout=30,
        context=second.log_text,
    )
    return first, second


def test_follower_takes_over_a_killed_leader_within_the_target(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
    record_property: Callable[[str, object], None],
) -> None:
    fake_nodes("dgx-h100:3")
    cluster_policies({})
    first, second = two_replicas(
        kube, control_plane, operator_namespace, start_operator, []
    )  # default timings
    old = holder(kube, operator_namespace)
    # The follower has read the held Lease at least once (the audit log keeps ServiceAccounts'
    # reads), so it knows when the lease ends and tries again just after it.
    wait_for(
        "the follower's first read of the held Lease",
        functools.partial(lease_reads, control_plane, user(operator_namespace, "replica-b")),
        until=lambda n: n >= 1,
        timeout=30,
        interval=0.05,
        context=second.log_text,
    )

    killed = time.time()
    first.kill()
    late = fake_nodes("dgx-h100:1", wait=False)[0]  # the change the new leader has to write
    new = wait_for(
        "the follower holding the Lease",
        lambda: holder(kube, operator_namespace),
        until=lambda h: h and h != old,
        timeout=60,
        interval=0.1,
        context=second.log_text,
    )
    lease_at = time.time() - killed
    wait_for(
        f"node {late} labelled by the new leader",
        lambda: labelled(kube, late),
        timeout=60,
        interval=0.1,
        context=second.log_text,
    )
    ours = [
        e
        for e in writes_by(control_plane, user(operator_namespace, "replica-b"), since=killed)
        if e["objectRef"].get("resource") != "leases"
    ]
    assert ours, "the new leader's writes must be in the audit log"
    first_write = min(epoch(e["stageTimestamp"]) for e in ours) - killed
    record_property("failover_lease_seconds", round(lease_at, 1))
    record_property("failover_first_write_seconds", round(first_write, 1))
    print(
        f"failover: lease taken {lease_at:.1f} s, first write {first_write:.1f} s after SIGKILL "
        f"(holder {new})"
    )
    # The Lease cannot change hands before it runs out: up to 15 s after the kill (a leader killed
    # right after renewing). So the bound is the lease plus scheduling slack, and the new leader's
    # start-up to its first write is bounded on its own.
    assert lease_at <= LEASE_SECONDS + 1.0, f"the follower held the Lease {lease_at:.1f} s after SIGKILL"
    assert first_write - lease_at <= 3.0, f"first write {first_write - lease_at:.1f} s after taking the Lease"


def test_a_paused_leader_does_not_write_after_it_resumes(
    kube: Client,
    control_plane: ControlPlane,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
    tmp_path: Path,
) -> None:
    """SIGSTOP the leader in the middle of labelling (its patches go one at a time through a slow
    line, so it has work queued), past its lease; the follower takes over. After SIGCONT the old
    leader's queued patches are refused by its fence and it stops: the audit log holds no write
    of its user received after the resume."""
    fake_nodes("dgx-h100:2")
    cluster_policies({})
    args = ["--leader-lease-renew-deadline=3", "--label-concurrency=1"]  # a lease of 8 s; patches in a row
    port = int(control_plane.server.rsplit(":", 1)[1])
    with FaultProxy("127.0.0.1", port) as slow:
        first = start_operator(
            leader_elect=True,
            extra_args=args,
            kubeconfig=slow.kubeconfig(
                replica_kubeconfig(control_plane, kube, operator_namespace, "replica-a"),
                tmp_path / "a.kubeconfig",
            ),
        )
        reconciled(kube, context=first.log_text)
        second = start_operator(
            leader_elect=True,
            extra_args=args,
            kubeconfig=replica_kubeconfig(control_plane, kube, operator_namespace, "replica-b"),
        )
        wait_for(
            "replica b waiting for the lease",
            lambda: "waiting for lease" in second.log_text(),
            timeout=30,
            context=second.log_text,
        )
        assert first.process is not None
        old = holder(kube, operator_namespace)
        started = time.time()
        slow.latency = 0.1  # from now on: the install went at full speed, the labelling crawls
        burst = fake_nodes("dgx-h100:12", wait=False)

        def node_patches() -> int:
            return sum(
                1
                for e in writes_by(control_plane, user(operator_namespace, "replica-a"), since=started)
                if e["objectRef"].get("resource") == "nodes"
            )

        wait_for(
            "the leader's first node label patches",
            node_patches,
            until=lambda n: n >= 2,
            timeout=60,
            interval=0.05,
            context=first.log_text,
        )
        os.kill(first.process.pid, signal.SIGSTOP)
        try:
            wait_for(
                "the follower holding the Lease",
                lambda: holder(kube, operator_namespace),
                until=lambda h: h and h != old,
                timeout=60,
                context=second.log_text,
            )
            for node in burst:
                wait_for(
                    f"node {node} labelled by the new leader",
                    functools.partial(labelled, kube, node),
                    timeout=60,
                    context=second.log_text,
                )
            patched_before = node_patches()
            assert patched_before < len(burst), "the leader finished before the pause: nothing was queued"
        finally:
            resumed = time.time()
            os.kill(first.process.pid, signal.SIGCONT)
        wait_for(
            "the old leader to stop on finding the Lease taken",
            lambda: not first.alive,
            timeout=30,
            context=first.log_text,
        )
    late = list(writes_by(control_plane, user(operator_namespace, "replica-a"), since=resumed))
    renewals, writes = split_late_writes(late)
    assert writes == [], f"the resumed ex-leader sent writes after SIGCONT: {writes}"
    assert "lost the lease" in first.log_text(), first.log_text()[-2000:]
    fenced = first.log_text().count("not sending")
    print(
        f"fence: paused after {patched_before} of {len(burst)} node patches; {fenced} queued write(s) "
        f"refused by the fence after SIGCONT, none reached the apiserver; {len(renewals)} stale lease "
        "renewal(s) answered 409 Conflict by the apiserver (took no effect)"
    )
    assert readyz(second) == 200


def split_late_writes(events: list[dict[str, object]]) -> tuple[list[str], list[str]]:
    """A resumed ex-leader's requests after SIGCONT, as (refused lease renewals, other writes).

    A renewal it had read the Lease for before the pause carries that read's resourceVersion, so
    the apiserver answers 409 Conflict and nothing changes: leader election working, not a write.
    Anything else is a write past the fence, listed with the status code the apiserver answered
    (2xx: it took effect)."""
    renewals, writes = [], []
    for event in events:
        ref = event.get("objectRef") or {}
        assert isinstance(ref, dict)
        code = status_code(event)
        line = f"{event.get('verb')} {ref.get('resource')}/{ref.get('name')} -> {code}"
        if ref.get("resource") == "leases" and ref.get("name") == LEASE_NAME and code == 409:
            renewals.append(line)
        else:
            writes.append(
                line + (" (took effect)" if code is not None and 200 <= code < 300 else " (refused)")
            )
    return renewals, writes
