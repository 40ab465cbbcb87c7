"""The Node reflector against a scripted apiserver (HTTP answers in order, served over HTTP/1.1 on
127.0.0.1: lists through the shared client, watches through kube/linestream.py, their bodies
chunked in small odd pieces so lines arrive split across reads): paged list, watch resume from
the last resourceVersion (bookmarks included), relist on 410 Gone (as an HTTP status and as an
ERROR event), resume without relisting after other failures, and heartbeats that change nothing
we read reported to nobody."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest
from lightkube import KubeConfig

from gpu_operator.controllers.reflector import NodeReflector, view_of
from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube.linestream import LineStreams

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true", "kubernetes.io/hostname": "x"}


def node(name: str, rv: str, labels: dict[str, str] | None = None, heartbeat: str = "t0") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "labels": labels or dict(GPU),
            "annotations": {"nvidia.com/gpu-driver-upgrade-enabled": "true", "other": "x"},
            "managedFields": [{"manager": "kwok"}],
        },
        "status": {
            "nodeInfo": {"kernelVersion": "6.8", "containerRuntimeVersion": "containerd://2.1"},
            "conditions": [{"type": "Ready", "lastHeartbeatTime": heartbeat}],
        },
    }


def node_list(items: list[dict[str, Any]], rv: str, cont: str | None = None) -> httpx2.Response:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return httpx2.Response(200, json={"kind": "NodeList", "metadata": meta, "items": items})


def stream(*events: tuple[str, dict[str, Any]]) -> httpx2.Response:
    body = "".join(json.dumps({"type": t, "object": o}) + "\n" for t, o in events)
    return httpx2.Response(200, content=body.encode())


def gone_event() -> tuple[str, dict[str, Any]]:
    return (
        "ERROR",
        {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"},
    )


class Script:
    """Answers requests in order; records each request's query; sets `stop` after the last."""

    def __init__(self, answers: list[Callable[[], httpx2.Response]]) -> None:
        self.answers = answers
        self.requests: list[dict[str, str]] = []
        self.stop = asyncio.Event()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(dict(request.url.params))
        if len(self.requests) >= len(self.answers):
            self.stop.set()
        if len(self.requests) > len(self.answers):
            return httpx2.Response(200, content=b"")  # an empty watch: ends at once
        return self.answers[len(self.requests) - 1]()


async def serve(script: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request per connection, answered from the script; a watch's body goes chunked in
    pieces of 7 bytes, each written on its own."""
    head = await reader.readuntil(b"\r\n\r\n")
    target = head.split(b" ")[1].decode()
    request = httpx2.Request("GET", "http://apiserver" + target)
    response = script(request)
    status = f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\nContent-Type: application/json\r\n"
    body = response.content
    if request.url.params.get("watch") == "true":
        writer.write(f"{status}Transfer-Encoding: chunked\r\n\r\n".encode())
        for at in range(0, len(body), 7):
            piece = body[at : at + 7]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
    else:
        writer.write(f"{status}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    writer.close()


async def run(
    script: Script, made: list[str] | None = None
) -> tuple[NodeReflector, list[tuple[str, NodeView | None]]]:
    """Run the reflector through the script; `made` gets the name of each node a view is made of."""
    changes: list[tuple[str, NodeView | None]] = []
    server = await asyncio.start_server(lambda r, w: serve(script, r, w), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    http = httpx2.AsyncClient(base_url=url)
    config = KubeConfig.from_server(url).get()
    assert config is not None
    streams = LineStreams(config)
    reflector = NodeReflector(
        http,
        streams,
        lambda name, view: changes.append((name, view)),
        backoff=Backoff(initial=0.0, cap=0.0),
        page_size=2,
    )
    if made is not None:
        reflector.to_view = lambda node: made.append(node.metadata.name) or view_of(node)  # type: ignore[func-returns-value]
    async with server:
        await asyncio.wait_for(reflector.run(script.stop), timeout=10)
    await http.aclose()
    return reflector, changes


def test_paged_list_then_watch_from_the_list_version() -> None:
    script = Script(
        [
            lambda: node_list([node("a", "1"), node("b", "2")], "10", cont="page2"),
            lambda: node_list([node("c", "3")], "10"),
            lambda: stream(("MODIFIED", node("a", "11", heartbeat="t1"))),
        ]
    )
    reflector, changes = asyncio.run(run(script))
    assert script.requests[0] == {"limit": "2"}
    assert script.requests[1] == {"limit": "2", "continue": "page2"}
    assert script.requests[2]["resourceVersion"] == "10"
    assert script.requests[2]["allowWatchBookmarks"] == "true"
    assert sorted(reflector.views) == ["a", "b", "c"]
    assert reflector.synced.is_set()
    # The heartbeat changed nothing the operator reads: only the three listed nodes were reported.
    assert [name for name, _ in changes] == ["a", "b", "c"]


def test_resume_from_the_last_event_and_bookmark() -> None:
    labelled = {**GPU, "nvidia.com/gpu.present": "true"}
    script = Script(
        [
            lambda: node_list([node("a", "1")], "10"),
            lambda: stream(
                ("MODIFIED", node("a", "12", labels=labelled)),
                ("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "20"}}),
            ),
            lambda: httpx2.Response(500, json={"kind": "Status", "code": 500}),
            lambda: stream(("DELETED", node("a", "21"))),
        ]
    )
    reflector, changes = asyncio.run(run(script))
    # The stream ended: resumed from the bookmark's version; after a 500, from the same version.
    assert [r.get("resourceVersion") for r in script.requests[1:4]] == ["10", "20", "20"]
    assert not any("limit" in r for r in script.requests[1:])  # never listed again
    assert [(name, view is not None) for name, view in changes] == [("a", True), ("a", True), ("a", False)]
    assert changes[1][1] is not None and changes[1][1].gpu_present
    assert reflector.views == {}
    assert reflector.resource_version == "21"


@pytest.mark.parametrize("gone", ["status", "event"])
def test_gone_lists_again_and_reports_what_changed_meanwhile(gone: str) -> None:
    labelled = {**GPU, "nvidia.com/gpu.present": "true"}

    def answer_gone() -> httpx2.Response:
        if gone == "status":
            return httpx2.Response(410, json={"kind": "Status", "code": 410, "reason": "Expired"})
        return stream(gone_event())

    script = Script(
        [
            lambda: node_list([node("a", "1"), node("b", "2")], "10"),
            answer_gone,
            # Meanwhile b was deleted, a relabelled and c added: the relist reports exactly that.
            lambda: node_list([node("a", "30", labels=labelled), node("c", "31")], "40"),
            lambda: stream(("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "41"}})),
        ]
    )
    reflector, changes = asyncio.run(run(script))
    assert "limit" in script.requests[2] and "resourceVersion" not in script.requests[2]
    assert script.requests[3]["resourceVersion"] == "40"
    assert [(name, view is not None) for name, view in changes[2:]] == [
        ("a", True),
        ("c", True),
        ("b", False),
    ]
    assert sorted(reflector.views) == ["a", "c"]


def test_a_heartbeat_makes_no_view() -> None:
    """What was decoded of a node is fingerprinted: a heartbeat (only its resourceVersion and the
    heartbeat time differ) costs no view; a label change, a node deleted and added back do."""
    labelled = {**GPU, "nvidia.com/gpu.present": "true"}
    script = Script(
        [
            lambda: node_list([node("a", "1"), node("b", "2")], "10"),
            lambda: stream(
                ("MODIFIED", node("a", "11", heartbeat="t1")),
                ("MODIFIED", node("b", "12", labels=labelled)),
                ("MODIFIED", node("a", "13", heartbeat="t2")),
                ("DELETED", node("a", "14", heartbeat="t2")),
                ("ADDED", node("a", "15", heartbeat="t2")),
            ),
        ]
    )
    made: list[str] = []
    reflector, changes = asyncio.run(run(script, made))
    assert made == ["a", "b", "b", "a"]
    assert [(name, view is not None) for name, view in changes] == [
        ("a", True),
        ("b", True),
        ("b", True),
        ("a", False),
        ("a", True),
    ]
    assert reflector.resource_version == "15"


def test_a_failed_first_list_is_retried_before_any_watch() -> None:
    script = Script(
        [
            lambda: httpx2.Response(503, json={"kind": "Status", "code": 503}),
            lambda: node_list([node("a", "1")], "10"),
            lambda: stream(),
        ]
    )
    reflector, _ = asyncio.run(run(script))
    assert "limit" in script.requests[0] and "limit" in script.requests[1]
    assert script.requests[2]["resourceVersion"] == "10"
    assert list(reflector.views) == ["a"]


def test_the_view_keeps_what_the_controllers_read() -> None:
    import msgspec

    from gpu_operator.controllers.reflector import SlimNode

    body = node("a", "1", labels={**GPU, "nvidia.com/gpu.deploy.driver": "true", "team": "x"})
    view = view_of(msgspec.json.decode(json.dumps(body), type=SlimNode))
    assert view == NodeView.of(body)  # the same view the kopf index built from the whole body
    assert view.annotations == {"nvidia.com/gpu-driver-upgrade-enabled": "true"}
    assert view.kernel == "6.8" and view.runtime == "containerd://2.1"
    assert view.selectable["team"] == "x" and "team" not in view.labels


def test_the_view_carries_what_the_upgrade_controller_reads() -> None:
    """Cordon, Ready and the upgrade state machine's own annotations; a heartbeat changes nothing."""
    import msgspec

    from gpu_operator.controllers.reflector import SlimNode

    body = node("a", "1")
    body["spec"] = {"unschedulable": True, "podCIDR": "10.0.0.0/24"}
    body["metadata"]["annotations"]["nvidia.com/gpu-driver-upgrade-drain-start-time"] = "1700000000"
    body["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t0"}]
    view = view_of(msgspec.json.decode(json.dumps(body), type=SlimNode))
    assert view == NodeView.of(body)
    assert view.unschedulable and view.ready
    assert view.annotations["nvidia.com/gpu-driver-upgrade-drain-start-time"] == "1700000000"
    assert "other" not in view.annotations
    body["status"]["conditions"][0]["lastHeartbeatTime"] = "t1"
    assert view_of(msgspec.json.decode(json.dumps(body), type=SlimNode)) == view
    body["status"]["conditions"][0]["status"] = "False"
    assert not view_of(msgspec.json.decode(json.dumps(body), type=SlimNode)).ready
