"""The operator's Kubernetes client: the one place that builds clients to the apiserver
(lightkube AsyncClient, a plain HTTP client, the Lease's client), all through one fenced
transport. `Kube` reads (kube/reads.py) and writes (kube/writes.py); the kinds and object keys
are in kube/resources.py (and importable from here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import SingleConfig

from gpu_operator.kube.h11pool import H11Pool
from gpu_operator.kube.linestream import LineStreams
from gpu_operator.kube.reads import Reads
from gpu_operator.kube.resources import (
    FIELD_MANAGER,
    STATUS_RESOURCES,
    ClusterPolicyResource,
    ComputeDomainCliqueResource,
    ComputeDomainResource,
    GPUClusterResource,
    NVIDIADriverResource,
    ObjectKey,
    PrometheusRuleResource,
    ServiceMonitorResource,
    resource_for,
)
from gpu_operator.kube.writes import WRITES, Fence, NotLeading, Writes, refusal

__all__ = [
    "FIELD_MANAGER",
    "STATUS_RESOURCES",
    "WRITES",
    "ClusterPolicyResource",
    "ComputeDomainCliqueResource",
    "ComputeDomainResource",
    "FencedTransport",
    "GPUClusterResource",
    "Kube",
    "NVIDIADriverResource",
    "NotLeading",
    "ObjectKey",
    "PrometheusRuleResource",
    "ServiceMonitorResource",
    "load_config",
    "resource_for",
]


def load_config(kubeconfig: str | None) -> KubeConfig:
    if kubeconfig:
        return KubeConfig.from_file(kubeconfig)
    return KubeConfig.from_env()


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class FencedTransport(httpx2.AsyncBaseTransport):
    """The one door every request of a client goes through. A write (any method but GET, HEAD,
    OPTIONS) is checked against the fence twice: when it enters, and again at the last moment,
    once a connection is ready and just before its first byte is written (the `trace`
    request extension, event `*.send_request_headers.started`). A request that waited for a
    connection, or sat in a process paused past its lease, is refused when it would go out.
    `exempt` names the writes the fence does not apply to (the Lease renewal itself)."""

    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport,
        fence: Callable[[], Fence | None],
        exempt: Callable[[httpx2.Request], bool] = lambda _: False,
    ) -> None:
        self.inner, self.fence, self.exempt = inner, fence, exempt

    def _check(self, request: httpx2.Request) -> None:
        fence = self.fence()
        if fence is not None and not fence():
            raise refusal(f"{request.method} {request.url.path}")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method not in READ_METHODS and not self.exempt(request):
            self._check(request)
            outer = request.extensions.get("trace")

            async def last_moment(event: str, info: dict[str, Any]) -> None:
                if event.endswith(".send_request_headers.started"):
                    self._check(request)
                if outer is not None:
                    await outer(event, info)

            request.extensions = {**request.extensions, "trace": last_moment}
        response = await self.inner.handle_async_request(request)
        if response.status_code == 404 and "json" not in response.headers.get("content-type", ""):
            return await _not_served(request, response)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _not_served(request: httpx2.Request, response: httpx2.Response) -> httpx2.Response:
    """A path the apiserver does not serve at all (a CRD not installed, a group/version not
    enabled) gets a plain-text 404, which lightkube passes on as a bare HTTP error instead of the
    ApiError a missing object raises. Answered here as the Status a missing object gets, so every
    caller handles "not there" in one way (`err.status.code == 404`)."""
    await response.aread()
    await response.aclose()
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": "NotFound",
        "code": 404,
        "message": f"the server does not serve {request.url.path} "
        f"({response.text.strip() or 'no body'}): is the CRD or API group installed?",
    }
    return httpx2.Response(
        404, headers={"content-type": "application/json"}, json=status, extensions=response.extensions
    )


def _body_name(request: httpx2.Request) -> str | None:
    try:
        body = json.loads(request.content or b"{}")
    except (ValueError, httpx2.RequestNotRead):
        return None
    return body.get("metadata", {}).get("name") if isinstance(body, dict) else None


# Connections kept open to the apiserver. The HTTP client's default keeps at most 20 idle
# connections, for 5 s: whenever more than 20 of the label gate's 32 were idle at once (the end of
# a burst) the surplus was closed, and the next burst opened them again, a TLS handshake each
# (82 connections seen during one 1,000-node labelling pass and what followed it, 61 with this
# pool: the 32 the gate uses and the rest of the operator's).
# Every one of the 100 may stay open while idle, for 60 s (kube/h11pool.py).
MAX_CONNECTIONS, KEEPALIVE_EXPIRY = 100, 60.0


def _transport(
    config: SingleConfig,
    fence: Callable[[], Fence | None],
    exempt: Callable[[httpx2.Request], bool] = lambda _: False,
) -> FencedTransport:
    """A fenced transport with the TLS settings lightkube derives from the config (CA, client
    certificate). Proxies from the environment are not used: the operator talks to the apiserver
    directly, as in-cluster clients do."""
    if config.user is None:
        raise ValueError("the kubeconfig's context names no user: add one with credentials for the apiserver")
    server = httpx2.URL(config.cluster.server)
    tls = (
        client_adapter.verify_cluster(config.cluster, config.user, config.abs_file)
        if server.scheme == "https"
        else None
    )
    pool = H11Pool(str(server), tls, max_connections=MAX_CONNECTIONS, keepalive_expiry=KEEPALIVE_EXPIRY)
    return FencedTransport(pool, fence, exempt)


class Kube(Reads, Writes):
    """Thin async wrapper: reads (kube/reads.py), writes (kube/writes.py), each write counted. Every
    request goes through a `FencedTransport`: with leader election (`fence` set), no write leaves
    this process, whatever sends it (lightkube or the plain `http` client), unless the fence
    says this replica leads. `lease_client` is the exception, for the Lease alone."""

    def __init__(
        self, kubeconfig: str | None = None, *, config: KubeConfig | SingleConfig | None = None
    ) -> None:
        loaded = config if config is not None else load_config(kubeconfig)
        single = loaded.get() if isinstance(loaded, KubeConfig) else loaded
        if single is None:
            raise ValueError(
                "the kubeconfig has no current context: set one (kubectl config use-context NAME)"
            )
        self.config: SingleConfig = single
        self.fence: Fence | None = None
        """With leader election: True while this replica may write (LeaderElector.leading)."""
        self.client = AsyncClient(
            self.config, field_manager=FIELD_MANAGER, transport=_transport(self.config, lambda: self.fence)
        )
        self._http: httpx2.AsyncClient | None = None
        self._streams: LineStreams | None = None
        self._lease_client: AsyncClient | None = None
        self.statuses_written: dict[tuple[str, str], dict[str, Any]] = {}
        """(kind, name) -> the status fields our last `patch_status` of that object sent."""

    def lease_client(self, namespace: str, name: str) -> AsyncClient:
        """The client leader election renews the Lease `namespace/name` with: it may write that
        Lease (create, update, delete) whatever the fence says, and nothing else, ever."""
        if self._lease_client is None:
            collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

            def the_lease(request: httpx2.Request) -> bool:
                path = request.url.path.rstrip("/")
                if request.method == "POST":  # a create names the object in its body
                    return path == collection and _body_name(request) == name
                return path == f"{collection}/{name}"

            closed: Fence = lambda: False  # noqa: E731
            self._lease_client = AsyncClient(
                self.config,
                field_manager=FIELD_MANAGER,
                transport=_transport(self.config, lambda: closed, the_lease),
            )
        return self._lease_client

    @property
    def http(self) -> httpx2.AsyncClient:
        """A plain HTTP client to the same apiserver (server, TLS, credentials from the same config)
        for the few requests lightkube has no call for: /version, lists by a raw label-selector
        string, evictions with their 429 body. Built through `lightkube.config.client_adapter` with the
        same fenced transport, never lightkube's private attributes; closed by `close()`."""
        if self._http is None:
            # ConnectionParams types its transport as sync; httpx's AsyncClient takes the async one.
            transport: Any = _transport(self.config, lambda: self.fence)
            params = client_adapter.ConnectionParams(transport=transport)
            self._http = client_adapter.AsyncClient(self.config, params)
        return self._http

    @property
    def streams(self) -> LineStreams:
        """Long-lived watch streams to the same apiserver with the same TLS settings and
        credentials, each on a connection of its own (kube/linestream.py). Reads only."""
        if self._streams is None:
            self._streams = LineStreams(self.config)
        return self._streams

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._lease_client is not None:
            await self._lease_client.close()
        await self.client.close()
