"""The driver pod watch: kube/slimwatch.py's list-then-watch of the pods of one namespace with one
label selector (the operator's namespace, the driver's component label), each decoded as a
`SlimPod` (kube/pages.py: owners, labels, node, env, readiness). A driver pod's status changes many
times while it starts (conditions, timestamps, container states) and most of those changes touch
none of the fields its view is made of: they cost a decode, an encode and a hash, and report
nothing. Before, kopf decoded each such event whole (about 2,400 of its 2,800 events in a
1,000-node rollout, bench/README.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx2
import msgspec
from prometheus_client import Counter

from gpu_operator.kube.linestream import LineStreams
from gpu_operator.kube.pages import SlimPod
from gpu_operator.kube.slimwatch import Counters, Decoders, OnViewChange, SlimWatch

EVENTS = Counter(
    "gpu_operator_driver_pod_watch_events", "Driver pod watch events received, by type", ["type"]
)
LISTS = Counter("gpu_operator_driver_pod_lists", "Full driver pod lists, by reason (start, gone)", ["reason"])

DECODERS = Decoders(SlimPod)

V = TypeVar("V")


class DriverPodWatch(SlimWatch[SlimPod, V]):
    """Keeps `views` (pod name -> the view `to_view` makes of a decoded pod, handed to it as plain
    dicts and lists with the fields `SlimPod` keeps) equal to the pods in
    `namespace` that match `selector`; calls `on_change(name, view, old)` for a pod whose view
    appeared (`old` None), changed, or went (`view` None, `old` its last view: where it ran)."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        streams: LineStreams,
        on_change: OnViewChange[V],
        to_view: Callable[[dict[str, Any]], V],
        *,
        namespace: str,
        selector: str,
        delay: Callable[[int], float],
        page_size: int = 500,
        server_timeout: float = 300,
        connect_timeout: float = 30,
    ) -> None:
        super().__init__(
            http,
            streams,
            on_change,
            lambda pod: to_view(msgspec.to_builtins(pod)),
            decoders=DECODERS,
            counters=Counters(EVENTS, LISTS),
            what="Driver pod",
            path=f"/api/v1/namespaces/{namespace}/pods",
            selector=selector,
            delay=delay,
            page_size=page_size,
            server_timeout=server_timeout,
            connect_timeout=connect_timeout,
        )
