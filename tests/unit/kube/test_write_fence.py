"""The leader-election fence holds on every write path: whatever sends a write through `Kube`
(its methods, its lightkube client, its plain HTTP client), a closed fence keeps the request
from leaving the process, and a fence that closes after the request entered still stops it just
before its first byte. Checked against a real HTTP server that records what arrives."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lightkube import KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap

from gpu_operator.kube.client import Kube, NotLeading, ObjectKey
from tests.support.ports import free_port

SRC = Path(__file__).resolve().parents[3] / "src" / "gpu_operator"


class Recorder:
    """An apiserver stand-in that answers anything and records (method, path) of what arrived."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path))
        if request.path == "/version":
            return web.json_response({"gitVersion": "v1.36.3"})
        if request.path.endswith("/gpuclusters"):  # what the apiserver answers for a CRD not installed
            return web.Response(status=404, text="404 page not found\n", content_type="text/plain")
        if request.method == "GET":
            if request.path.endswith("s") or "/configmaps" in request.path and request.path.count("/") == 5:
                return web.json_response({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []})
            return web.json_response({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
        if request.method == "DELETE":
            return web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Success"})
        body = json.loads(await request.read() or b"{}")
        body.setdefault("metadata", {}).setdefault("name", "x")
        return web.json_response(body, status=201 if request.method == "POST" else 200)

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.seen if m not in ("GET", "HEAD")]


@pytest.fixture
def server() -> Iterator[tuple[Recorder, int]]:
    recorder = Recorder()
    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    asyncio.set_event_loop(loop)
    try:
        yield recorder, port
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()
        asyncio.set_event_loop(None)


def _kube(port: int) -> Kube:
    return Kube(
        config=KubeConfig.from_one(cluster=Cluster(server=f"http://127.0.0.1:{port}"), user=User(token="t"))
    )


CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns"}, "data": {}}
NODE = {"apiVersion": "v1", "kind": "Node", "name": "n1"}

# Every public coroutine of Kube: a call with sample arguments, and whether it writes.
CALLS: dict[str, tuple[Callable[[Kube], Awaitable[Any]], bool]] = {
    "apply": (lambda k: k.apply(CM), True),
    # A dry-run apply persists nothing, but it is a PATCH on the wire: the fence holds it like one
    # (`gpu-operator diff` runs without a fence).
    "apply_dry_run": (lambda k: k.apply_dry_run(CM), True),
    "delete": (lambda k: k.delete(ObjectKey("v1", "ConfigMap", "cm", "ns")), True),
    "merge_patch": (lambda k: k.merge_patch("v1", "Node", "n1", {"metadata": {"labels": {"a": "b"}}}), True),
    "patch_status": (lambda k: k.patch_status("ClusterPolicy", "cluster-policy", {"state": "ready"}), True),
    "served_versions": (lambda k: k.served_versions("resource.k8s.io", "DeviceClass"), False),
    "list_all": (lambda k: k.list_all("/api/v1/namespaces/ns/pods"), False),
    "get_answer": (lambda k: k.get_answer("/readyz"), False),
    "count": (lambda k: k.count("/apis/nvidia.com/v1/clusterpolicies"), False),
    "list_items": (lambda k: k.list_items("apps", "v1", "daemonsets", "ns"), False),
    "list_pods": (lambda k: k.list_pods("ns", labels="app=x", fields="spec.nodeName=n1", slim=True), False),
    "count_items": (lambda k: k.count_items("nvidia.com", "v1", "clusterpolicies"), False),
    "list_resource_claims": (lambda k: k.list_resource_claims("ns"), False),
    "read_list": (lambda k: k.read_list("", "v1", "nodes"), False),
    "read_version": (lambda k: k.read_version(), False),
    "read_readyz": (lambda k: k.read_readyz(timeout=1.0), False),
    "read_pod_log": (lambda k: k.read_pod_log("ns", "p", "c", tail_lines=10, previous=True), False),
    "evict": (lambda k: k.evict("ns", "p"), True),
    "node_event": (lambda k: k.node_event("n1", "Reason", "message"), True),
    "event": (lambda k: k.event(NODE, "Reason", "message"), True),
    "list_dicts": (lambda k: k.list_dicts("v1", "ConfigMap", namespace="ns"), False),
    "get_dict": (lambda k: k.get_dict("v1", "ConfigMap", "cm", namespace="ns"), False),
    "server_version": (lambda k: k.server_version(), False),
}
RAW: dict[str, Callable[[Kube], Awaitable[Any]]] = {
    "lightkube create": lambda k: k.client.create(ConfigMap(metadata=ObjectMeta(name="cm", namespace="ns"))),
    "lightkube delete": lambda k: k.client.delete(ConfigMap, "cm", namespace="ns"),
    "http eviction": lambda k: k.http.post(
        "/api/v1/namespaces/ns/pods/p/eviction", json={"kind": "Eviction"}
    ),
    "http put": lambda k: k.http.request("PUT", "/api/v1/namespaces/ns/configmaps/cm", json=CM),
}


def test_every_public_coroutine_of_kube_is_listed() -> None:
    coroutines = {
        name
        for name, fn in inspect.getmembers(Kube, inspect.iscoroutinefunction)
        if not name.startswith("_") and name != "close"
    }
    assert coroutines == set(CALLS), "a new Kube method: add it to CALLS, saying whether it writes"


def _run(
    port: int, fence: Callable[[], bool] | None, call: Callable[[Kube], Awaitable[Any]]
) -> BaseException | None:
    async def go() -> BaseException | None:
        kube = _kube(port)
        kube.fence = fence
        try:
            await call(kube)
        except Exception as err:  # the outcome under test
            return err
        finally:
            await kube.close()
        return None

    return asyncio.get_event_loop().run_until_complete(go())


@pytest.mark.parametrize("name", sorted(CALLS) + sorted(RAW))
def test_a_closed_fence_keeps_every_write_in_the_process(server: tuple[Recorder, int], name: str) -> None:
    recorder, port = server
    call, writes = CALLS.get(name, (RAW.get(name), True))
    assert call is not None
    outcome = _run(port, lambda: False, call)
    if writes:
        assert isinstance(outcome, NotLeading), outcome
        assert "not sending" in str(outcome)
        assert recorder.writes() == []
    else:
        assert outcome is None and recorder.seen  # reads go out whatever the fence says
    recorder.seen.clear()
    assert _run(port, lambda: True, call) is None  # the same call with the fence open arrives
    assert recorder.writes() if writes else recorder.seen


def test_a_fence_that_closes_after_the_request_entered_stops_it_before_its_first_byte(
    server: tuple[Recorder, int],
) -> None:
    """The paused-leader window: a write passed the first check, then waited (for a connection,
    or in a paused process) until the lease had run out. The check at send time refuses it."""
    recorder, port = server
    answers = iter([True])  # open at the door, closed at the moment of sending
    outcome = _run(port, lambda: next(answers, False), RAW["http eviction"])
    assert isinstance(outcome, NotLeading) and recorder.writes() == []


def test_the_lease_client_writes_its_lease_and_nothing_else(server: tuple[Recorder, int]) -> None:
    recorder, port = server
    lease = Lease(metadata=ObjectMeta(name="53822513.nvidia.com", namespace="ops"))

    async def go() -> list[str]:
        kube = _kube(port)
        kube.fence = lambda: False  # not leading: the renewal must still go out
        client = kube.lease_client("ops", "53822513.nvidia.com")
        refused = []
        try:
            await client.create(lease)
            await client.replace(lease)
            await client.delete(Lease, "53822513.nvidia.com", namespace="ops")
            for other in (
                client.create(Lease(metadata=ObjectMeta(name="other", namespace="ops"))),
                client.delete(Lease, "53822513.nvidia.com", namespace="elsewhere"),
                client.create(ConfigMap(metadata=ObjectMeta(name="cm", namespace="ops"))),
            ):
                try:
                    await other
                except NotLeading as err:
                    refused.append(str(err))
        finally:
            await kube.close()
        return refused

    refused = asyncio.get_event_loop().run_until_complete(go())
    base = "/apis/coordination.k8s.io/v1/namespaces/ops/leases"
    assert recorder.writes() == [
        ("POST", base),
        ("PUT", f"{base}/53822513.nvidia.com"),
        ("DELETE", f"{base}/53822513.nvidia.com"),
    ]
    assert len(refused) == 3, refused  # another Lease, the Lease elsewhere, another kind
    assert any("/namespaces/elsewhere/" in r for r in refused) and any("/configmaps" in r for r in refused)


def _client_constructions(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("AsyncClient", "Client", "AsyncHTTPTransport"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}(...)")
    return found


def test_the_operator_process_builds_no_client_but_kubes() -> None:
    """The operator's writes can only take the fenced paths if nothing in it builds another
    client: only kube/client.py constructs one. (The commands a user or the chart's pre-delete
    Job runs, without leader election, are in admin/; they build no client either, but use
    kube/reach.py's.)"""
    run_by_operator = sorted((SRC / "controllers").rglob("*.py"))
    assert run_by_operator
    assert [c for p in run_by_operator for c in _client_constructions(p)] == []
    assert _client_constructions(SRC / "kube" / "client.py")  # the scan finds the ones that exist


def test_a_path_the_server_does_not_serve_is_a_404_status_like_a_missing_object(
    server: tuple[Recorder, int],
) -> None:
    """A CRD not installed: the apiserver's plain-text 404 reaches callers as ApiError 404 (what
    they handle), not as a bare HTTP error that crashed `cleanup` before."""
    from lightkube.core.exceptions import ApiError

    _recorder, port = server

    async def go() -> None:
        kube = _kube(port)
        try:
            with pytest.raises(ApiError) as refused:
                await kube.list_dicts("nvidia.com/v1alpha1", "GPUCluster")
            assert refused.value.status.code == 404
            assert "does not serve /apis/nvidia.com/v1alpha1/gpuclusters" in str(refused.value.status.message)
            assert await kube.count("/apis/nvidia.com/v1alpha1/gpuclusters") is None
            assert await kube.count("/api/v1/configmaps") == 0
        finally:
            await kube.close()

    asyncio.get_event_loop().run_until_complete(go())
