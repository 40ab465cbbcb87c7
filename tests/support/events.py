"""Reading Events in integration tests."""

from __future__ import annotations

from lightkube import Client
from lightkube.resources.core_v1 import Event


def node_events(kube: Client, node: str) -> list[Event]:
    """The Events about a Node (they live in the default namespace)."""
    return [
        e
        for e in kube.list(Event, namespace="default")
        if e.involvedObject and e.involvedObject.kind == "Node" and e.involvedObject.name == node
    ]


def namespace_story(kube: Client, namespace: str) -> str:
    """What a failed wait on a namespace's Jobs and pods needs to be read afterwards: every Job
    (active, succeeded, failed, its conditions), every pod (node, phase, conditions, each
    container's state) and the namespace's Events, oldest first."""
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import Pod

    lines = [f"--- namespace {namespace} ---"]
    for job in kube.list(Job, namespace=namespace):
        st = job.status
        conditions = [(c.type, c.status, c.reason) for c in (st.conditions if st else None) or []]
        lines.append(
            f"Job {job.metadata.name if job.metadata else None}: active={st.active if st else None} "
            f"succeeded={st.succeeded if st else None} failed={st.failed if st else None} {conditions}"
        )
    for pod in kube.list(Pod, namespace=namespace):
        ps = pod.status
        conditions = [(c.type, c.status, c.reason) for c in (ps.conditions if ps else None) or []]
        states = [
            (c.name, c.state.to_dict() if c.state else None, c.restartCount)
            for c in (ps.containerStatuses if ps else None) or []
        ]
        lines.append(
            f"Pod {pod.metadata.name if pod.metadata else None} on {pod.spec.nodeName if pod.spec else None}: "
            f"{ps.phase if ps else None} {conditions} {states}"
        )
    events = sorted(
        kube.list(Event, namespace=namespace),
        key=lambda e: str(e.lastTimestamp or e.eventTime or e.metadata.creationTimestamp),
    )
    lines += [
        f"Event {e.involvedObject.kind}/{e.involvedObject.name}: {e.reason}: {e.message}" for e in events
    ]
    return "\n".join(lines)
