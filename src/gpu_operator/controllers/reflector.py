"""The operator's reflectors: kube/nodewatch.py's NodeWatch, each decoded Node kept as the
`NodeView` the rest of the operator reads (built straight from the decoded fields, label strings
interned), and kube/driverpodwatch.py's watch of the driver pods in the operator's namespace, each
kept as a `DriverPodView`; both retry with the operator's watch backoff."""

from __future__ import annotations

import sys
import time
from typing import TypedDict, Unpack

import httpx2

from gpu_operator.controllers.settings import Backoff, OperatorSettings
from gpu_operator.controllers.views import DriverPodView, NodeView, gpu_condition, kept_taints, mig_condition
from gpu_operator.kube.driverpodwatch import DriverPodWatch
from gpu_operator.kube.linestream import LineStreams
from gpu_operator.kube.nodewatch import NODES_PATH, Gone, NodeWatch, OnChange, SlimNode
from gpu_operator.kube.slimwatch import OnViewChange
from gpu_operator.vocabulary import COMPONENT, DRIVER_COMPONENT_VALUE

__all__ = [
    "DRIVER_POD_LABELS",
    "Gone",
    "NodeReflector",
    "SlimNode",
    "WatchSizes",
    "driver_pod_reflector",
    "interned",
    "view_of",
]

# Driver pods (any owner, or none: the migration rule looks for orphaned ones), by their label.
DRIVER_POD_LABELS = {COMPONENT: DRIVER_COMPONENT_VALUE}


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


class WatchSizes(TypedDict, total=False):
    """A reflector's list page size and its watch's timeouts (the operator's settings)."""

    page_size: int
    server_timeout: float
    connect_timeout: float


def driver_pod_reflector(
    http: httpx2.AsyncClient,
    streams: LineStreams,
    on_change: OnViewChange[DriverPodView],
    *,
    namespace: str,
    backoff: Backoff | None = None,
    **sizes: Unpack[WatchSizes],
) -> DriverPodWatch[DriverPodView]:
    """The driver pods of the operator's namespace (label app.kubernetes.io/component=nvidia-driver),
    each kept as a DriverPodView; `sizes`: the watch's page_size and timeouts."""
    return DriverPodWatch(
        http,
        streams,
        on_change,
        DriverPodView.of,
        namespace=namespace,
        selector=",".join(f"{k}={v}" for k, v in DRIVER_POD_LABELS.items()),
        delay=(backoff or OperatorSettings().watch_backoff).delay,
        **sizes,
    )
