"""The driver pod reflector against a scripted apiserver (tests/unit/controllers/test_reflector.py's
script and server: HTTP answers in order, watch bodies chunked in odd pieces): it lists and watches
the operator's namespace with the driver's label selector, makes a `DriverPodView` only when a field
it reads changed (a driver pod's status churns while it starts: conditions, timestamps), reports
each change with the view before it, and a pod that went with its last view (so its node is known);
the manager turns each into a DRIVER_POD event for that node."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import msgspec
from lightkube import KubeConfig

from gpu_operator.controllers.loop import EventKind, ObjectEvent
from gpu_operator.controllers.manager import Manager
from gpu_operator.controllers.reflector import driver_pod_reflector
from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.views import DriverPodView
from gpu_operator.kube.driverpodwatch import DECODERS
from gpu_operator.kube.linestream import LineStreams
from tests.unit.controllers.test_reflector import Script, serve, stream

NS = "gpu-operator"
DS_UID = "0b7c-ds"


def pod(
    name: str, rv: str, node: str, *, ready: bool = False, stamp: str = "t0", restarts: int = 0
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "resourceVersion": rv,
            "labels": {"app.kubernetes.io/component": "nvidia-driver", "controller-revision-hash": "5d9f"},
            "ownerReferences": [
                {"kind": "DaemonSet", "name": "nvidia-driver-daemonset", "uid": DS_UID, "controller": True}
            ],
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "driver", "image": "x", "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": "d1"}]}
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": stamp}],
            "containerStatuses": [
                {"name": "driver", "ready": ready, "restartCount": restarts, "started": True}
            ],
        },
    }


def pod_list(items: list[dict[str, Any]], rv: str) -> httpx2.Response:
    return httpx2.Response(200, json={"kind": "PodList", "metadata": {"resourceVersion": rv}, "items": items})


Change = tuple[str, DriverPodView | None, DriverPodView | None]


async def run(script: Script, paths: list[str], made: list[str]) -> list[Change]:
    changes: list[Change] = []

    async def recorded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        paths.append(head.split(b" ")[1].decode().split("?")[0])
        replay = asyncio.StreamReader()
        replay.feed_data(head)
        await serve(script, replay, writer)

    server = await asyncio.start_server(recorded, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    http = httpx2.AsyncClient(base_url=url)
    config = KubeConfig.from_server(url).get()
    assert config is not None

    def view(p: dict[str, Any]) -> DriverPodView:
        made.append(p["metadata"]["name"])
        return DriverPodView.of(p)

    reflector = driver_pod_reflector(
        http,
        LineStreams(config),
        lambda name, view, old: changes.append((name, view, old)),
        namespace=NS,
        backoff=Backoff(initial=0.0, cap=0.0),
    )
    reflector.to_view = lambda p: view(msgspec.to_builtins(p))
    async with server:
        await asyncio.wait_for(reflector.run(script.stop), timeout=10)
    await http.aclose()
    return changes


def test_lists_and_watches_driver_pods_and_reports_only_what_changed_what_it_reads() -> None:
    script = Script(
        [
            lambda: pod_list([pod("driver-a", "1", "node-a"), pod("driver-b", "2", "node-b")], "10"),
            lambda: stream(
                ("MODIFIED", pod("driver-a", "11", "node-a", stamp="t1")),  # status churn only
                ("MODIFIED", pod("driver-a", "12", "node-a", ready=True, stamp="t2")),
                ("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "13"}}),
                ("DELETED", pod("driver-b", "14", "node-b")),
            ),
            lambda: stream(),  # the server ended the watch: resumed
        ]
    )
    paths: list[str] = []
    made: list[str] = []
    changes = asyncio.run(run(script, paths, made))

    assert set(paths) == {f"/api/v1/namespaces/{NS}/pods"}
    selectors = {request.get("labelSelector") for request in script.requests}
    assert selectors == {"app.kubernetes.io/component=nvidia-driver"}
    assert script.requests[1]["watch"] == "true" and script.requests[1]["resourceVersion"] == "10"
    assert script.requests[2]["resourceVersion"] == "14"  # resumed from the last event
    # the churn event (resourceVersion 11) made no view
    assert made == ["driver-a", "driver-b", "driver-a"]
    listed_a, listed_b, ready_a, gone_b = changes
    assert (listed_a[0], listed_a[2]) == ("driver-a", None) and listed_a[1] is not None
    assert listed_a[1].node == "node-a" and listed_a[1].daemonset == DS_UID and listed_a[1].digest == "d1"
    assert not listed_a[1].ready and listed_b[0] == "driver-b"
    assert (
        ready_a[0] == "driver-a" and ready_a[1] is not None and ready_a[1].ready and ready_a[2] == listed_a[1]
    )
    assert gone_b == ("driver-b", None, listed_b[1])


def test_the_view_is_the_same_as_of_the_whole_pod() -> None:
    def slim(body: dict[str, Any]) -> dict[str, Any]:
        return msgspec.to_builtins(DECODERS.item(msgspec.json.encode(body)))  # type: ignore[no-any-return]

    whole = pod("driver-a", "1", "node-a", ready=True, restarts=3)
    whole["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    assert DriverPodView.of(slim(whole)) == DriverPodView.of(whole)
    orphan = pod("driver-o", "1", "node-o")
    orphan["metadata"].pop("ownerReferences")
    assert DriverPodView.of(slim(orphan)).orphaned


def test_a_change_is_an_event_for_the_pods_node_and_a_gone_pod_for_the_node_it_ran_on() -> None:
    events: list[Any] = []

    class Dispatch:
        def dispatch(self, event: Any) -> None:
            events.append(event)

    view = DriverPodView("driver-a", "node-a", True, False)
    Manager._driver_pod_changed(Dispatch(), "driver-a", view, None)  # type: ignore[arg-type]
    Manager._driver_pod_changed(Dispatch(), "driver-a", None, view)  # type: ignore[arg-type]
    unscheduled = DriverPodView("driver-x", "", False, False)
    Manager._driver_pod_changed(Dispatch(), "driver-x", unscheduled, None)  # type: ignore[arg-type]
    assert [(e.kind, e.node) for e in events] == [
        (EventKind.DRIVER_POD, "node-a"),
        (EventKind.DRIVER_POD, "node-a"),
        (EventKind.DRIVER_POD, None),
    ]
    assert all(isinstance(e, ObjectEvent) for e in events)
