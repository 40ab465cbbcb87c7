"""The Node watch: kube/slimwatch.py's list-then-watch of Nodes on a line stream of its own (kubelet
or kwok heartbeats, one event per node every few minutes, are the operator's steadiest cost while
idle), each Node decoded into the few fields the operator reads: a heartbeat changes none of them,
so it costs one decode, one encode and a hash, and reports nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx2
import msgspec
from prometheus_client import Counter

from gpu_operator.kube.linestream import LineStreams
from gpu_operator.kube.slimwatch import Counters, Decoders, Gone, OnChange, SlimWatch

__all__ = ["DECODERS", "NODES_PATH", "Gone", "NodeWatch", "OnChange", "SlimNode"]

EVENTS = Counter("gpu_operator_node_watch_events", "Node watch events received, by type", ["type"])
LISTS = Counter("gpu_operator_node_lists", "Full Node lists, by reason (start, gone)", ["reason"])

NODES_PATH = "/api/v1/nodes"


class _Meta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _NodeInfo(msgspec.Struct):
    kernelVersion: str = ""
    containerRuntimeVersion: str = ""
    kubeletVersion: str = ""


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""  # heartbeat times are skipped: a heartbeat changes no view
    reason: str = ""  # (reason and message: the GPU health signals compare their own condition)
    message: str = ""


class _Status(msgspec.Struct):
    nodeInfo: _NodeInfo | None = None
    conditions: list[_Condition] | None = None


class _Taint(msgspec.Struct):
    key: str = ""
    effect: str = ""
    value: str = ""


class _Spec(msgspec.Struct):
    unschedulable: bool = False
    taints: list[_Taint] | None = None


class SlimNode(msgspec.Struct):
    """The part of a Node the decoder builds; every other field is skipped."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec | None = None
    status: _Status | None = None


DECODERS = Decoders(SlimNode)

V = TypeVar("V")


class NodeWatch(SlimWatch[SlimNode, V]):
    """Keeps `views` (node name -> the view `to_view` makes of a decoded Node) equal to the
    apiserver's Nodes; calls `on_change(name, view)` for a new or changed view and
    `on_change(name, None)` for a node that is gone. `synced` is set once the first list is in.
    `delay(n)` is the wait after the n-th failure in a row."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        streams: LineStreams,
        on_change: OnChange[V],
        to_view: Callable[[SlimNode], V],
        *,
        delay: Callable[[int], float],
        page_size: int = 500,
        server_timeout: float = 300,
        connect_timeout: float = 30,
        path: str = NODES_PATH,
    ) -> None:
        super().__init__(
            http,
            streams,
            lambda name, view, _old: on_change(name, view),
            to_view,
            decoders=DECODERS,
            counters=Counters(EVENTS, LISTS),
            what="Node",
            path=path,
            delay=delay,
            page_size=page_size,
            server_timeout=server_timeout,
            connect_timeout=connect_timeout,
        )
