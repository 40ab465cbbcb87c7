"""The operator's Node reflector: kube/nodewatch.py's NodeWatch, each decoded Node kept as the
`NodeView` the rest of the operator reads (built straight from the decoded fields, label strings
interned), retrying with the operator's watch backoff."""

from __future__ import annotations

import sys
import time

import httpx2

from gpu_operator.controllers.settings import Backoff, OperatorSettings
from gpu_operator.controllers.views import NodeView, gpu_condition, kept_taints, mig_condition
from gpu_operator.kube.linestream import LineStreams
from gpu_operator.kube.nodewatch import NODES_PATH, Gone, NodeWatch, OnChange, SlimNode

__all__ = ["Gone", "NodeReflector", "SlimNode", "interned", "view_of"]


def interned(mapping: dict[str, str]) -> dict[str, str]:
    # Label keys and most values repeat on every node: one string object each, not one per node.
    return {sys.intern(k): sys.intern(v) for k, v in mapping.items()}


def view_of(node: SlimNode) -> NodeView:
    """The NodeView of a decoded Node."""
    meta = node.metadata
    info = node.status.nodeInfo if node.status is not None else None
    conditions = (node.status.conditions if node.status is not None else None) or []
    return NodeView.of_parts(
        meta.name,
        interned(meta.labels or {}),
        meta.annotations or {},
        runtime=sys.intern(info.containerRuntimeVersion) if info else "",
        kernel=sys.intern(info.kernelVersion) if info else "",
        kubelet=sys.intern(info.kubeletVersion) if info else "",
        unschedulable=node.spec.unschedulable if node.spec else False,
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        seen=time.monotonic(),
        taints=kept_taints(node.spec.taints if node.spec else None),
        gpu_condition=gpu_condition(conditions),
        mig_condition=mig_condition(conditions),
    )


class NodeReflector(NodeWatch[NodeView]):
    def __init__(
        self,
        http: httpx2.AsyncClient,
        streams: LineStreams,
        on_change: OnChange[NodeView],
        *,
        backoff: Backoff | None = None,
        page_size: int = 500,
        server_timeout: float = 300,
        connect_timeout: float = 30,
        path: str = NODES_PATH,
    ) -> None:
        super().__init__(
            http,
            streams,
            on_change,
            view_of,
            delay=(backoff or OperatorSettings().watch_backoff).delay,
            page_size=page_size,
            server_timeout=server_timeout,
            connect_timeout=connect_timeout,
            path=path,
        )
