"""The operator's Kubernetes client: the one place that sends requests (lightkube AsyncClient)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ApiError
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import PatchType
from prometheus_client import Counter

from gpu_operator.kube import pages
from gpu_operator.kube.linestream import LineStreams

FIELD_MANAGER = "gpu-operator"
log = logging.getLogger(__name__)

ClusterPolicyResource = create_global_resource("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies")
NVIDIADriverResource = create_global_resource("nvidia.com", "v1alpha1", "NVIDIADriver", "nvidiadrivers")
GPUClusterResource = create_global_resource("nvidia.com", "v1alpha1", "GPUCluster", "gpuclusters")
# NVIDIA's DRA driver's IMEX kinds, whose CRDs we ship (registered for lists by kind).
ComputeDomainResource = create_namespaced_resource("resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains")
ComputeDomainCliqueResource = create_namespaced_resource("resource.nvidia.com", "v1beta1", "ComputeDomainClique",
                                                         "computedomaincliques")
# Our CRs with a status subresource, by kind.
STATUS_RESOURCES: dict[str, Any] = {"ClusterPolicy": ClusterPolicyResource, "NVIDIADriver": NVIDIADriverResource,
                                    "GPUCluster": GPUClusterResource}
ServiceMonitorResource = create_namespaced_resource(
    "monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors")
PrometheusRuleResource = create_namespaced_resource(
    "monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules")

# Every write this process sends, by verb and kind: the idle-write benchmark and tests read it.
WRITES = Counter("gpu_operator_api_write_requests", "Write requests sent to the Kubernetes API",
                 ["verb", "kind"])


class NotLeading(RuntimeError):
    """A write refused by the leader-election fence."""


@dataclass(frozen=True)
class ObjectKey:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectKey:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def resource_for(api_version: str, kind: str) -> Any:
    """The lightkube resource class for an apiVersion/kind (built-ins and the CRDs we use)."""
    return resource_registry.load(api_version, kind)


def load_config(kubeconfig: str | None) -> KubeConfig:
    if kubeconfig:
        return KubeConfig.from_file(kubeconfig)
    return KubeConfig.from_env()


Fence = Callable[[], bool]
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _refusal(what: str) -> NotLeading:
    return NotLeading(f"not sending {what}: this replica's leader Lease may have run out "
                      "(not renewed in time: paused or cut off); it writes again only after "
                      "renewing it, or stops if another replica holds it")


class FencedTransport(httpx2.AsyncBaseTransport):
    """The one door every request of a client goes through. A write (any method but GET, HEAD,
    OPTIONS) is checked against the fence twice: when it enters, and again at the last moment,
    once a connection is ready and just before its first byte is written (httpcore's `trace`
    request extension, event `*.send_request_headers.started`). A request that waited for a
    connection, or sat in a process paused past its lease, is refused when it would go out.
    `exempt` names the writes the fence does not apply to (the Lease renewal itself)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, fence: Callable[[], Fence | None],
                 exempt: Callable[[httpx2.Request], bool] = lambda _: False) -> None:
        self.inner, self.fence, self.exempt = inner, fence, exempt

    def _check(self, request: httpx2.Request) -> None:
        fence = self.fence()
        if fence is not None and not fence():
            raise _refusal(f"{request.method} {request.url.path}")

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
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound",
              "code": 404, "message": f"the server does not serve {request.url.path} "
                                      f"({response.text.strip() or 'no body'}): is the CRD or API group installed?"}
    return httpx2.Response(404, headers={"content-type": "application/json"}, json=status,
                           extensions=response.extensions)


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
POOL = httpx2.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=60.0)


def _transport(config: SingleConfig, fence: Callable[[], Fence | None],
               exempt: Callable[[httpx2.Request], bool] = lambda _: False) -> FencedTransport:
    """A fenced transport with the TLS settings lightkube derives from the config (CA, client
    certificate). Proxies from the environment are not used: the operator talks to the apiserver
    directly, as in-cluster clients do."""
    if config.user is None:
        raise ValueError("the kubeconfig's context names no user: add one with credentials for the apiserver")
    verify = client_adapter.verify_cluster(config.cluster, config.user, config.abs_file)
    return FencedTransport(httpx2.AsyncHTTPTransport(verify=verify, limits=POOL), fence, exempt)


class Kube:
    """Thin async wrapper: apply, delete, patch, status writes; each write is counted. Every
    request goes through a `FencedTransport`: with leader election (`fence` set), no write leaves
    this process, whatever sends it (lightkube or the plain `http` client), unless the fence
    says this replica leads. `lease_client` is the exception, for the Lease alone."""

    def __init__(self, kubeconfig: str | None = None, *, config: KubeConfig | SingleConfig | None = None) -> None:
        loaded = config if config is not None else load_config(kubeconfig)
        single = loaded.get() if isinstance(loaded, KubeConfig) else loaded
        if single is None:
            raise ValueError("the kubeconfig has no current context: set one (kubectl config use-context NAME)")
        self.config: SingleConfig = single
        self.fence: Fence | None = None
        """With leader election: True while this replica may write (LeaderElector.leading)."""
        self.client = AsyncClient(self.config, field_manager=FIELD_MANAGER,
                                  transport=_transport(self.config, lambda: self.fence))
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
            self._lease_client = AsyncClient(self.config, field_manager=FIELD_MANAGER,
                                             transport=_transport(self.config, lambda: closed, the_lease))
        return self._lease_client

    def write(self, verb: str, kind: str) -> None:
        """Every write of ours passes here first: refused early without the lease, else counted.
        (The transport refuses it again at the last moment.)"""
        if self.fence is not None and not self.fence():
            raise _refusal(f"{verb} {kind}")
        WRITES.labels(verb, kind).inc()

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

    async def apply(self, obj: dict[str, Any], field_manager: str = FIELD_MANAGER) -> None:
        key = ObjectKey.of(obj)
        self.write("apply", key.kind)
        await self.client.patch(
            resource_for(key.api_version, key.kind), key.name, obj, namespace=key.namespace,
            patch_type=PatchType.APPLY, field_manager=field_manager, force=True,
        )

    async def delete(self, key: ObjectKey, *, orphan: bool = False, foreground: bool = False) -> bool:
        """Delete; False when it was already gone. `orphan` leaves the dependents (pods) running;
        `foreground` keeps the object until the garbage collector has deleted its dependents."""
        self.write("delete", key.kind)
        kwargs: dict[str, Any] = {"namespace": key.namespace} if key.namespace else {}
        if orphan or foreground:
            from lightkube.types import CascadeType
            kwargs["cascade"] = CascadeType.ORPHAN if orphan else CascadeType.FOREGROUND
        try:
            await self.client.delete(resource_for(key.api_version, key.kind), key.name, **kwargs)
        except ApiError as err:
            if err.status.code == 404:
                return False
            raise
        return True

    async def merge_patch(self, api_version: str, kind: str, name: str, patch: dict[str, Any],
                          namespace: str | None = None) -> None:
        self.write("patch", kind)
        await self.client.patch(
            resource_for(api_version, kind), name, patch, namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def patch_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status of one of our CRs (ClusterPolicy, NVIDIADriver, GPUCluster)."""
        self.write("patch", f"{kind}/status")
        await self.client.patch(STATUS_RESOURCES[kind].Status, name, {"status": status}, patch_type=PatchType.MERGE)
        self.statuses_written[(kind, name)] = status

    async def served_versions(self, group: str, kind: str) -> list[str]:
        """The versions of an API group that serve `kind`, as discovery lists them (preferred first);
        empty when the group is not served."""
        response = await self.http.get(f"/apis/{group}")
        if response.status_code == 404:
            return []
        response.raise_for_status()
        versions = [v["version"] for v in response.json().get("versions") or []]
        serving = []
        for version in versions:
            listing = await self.http.get(f"/apis/{group}/{version}")
            if listing.status_code == 404:
                continue
            listing.raise_for_status()
            if any(r.get("kind") == kind for r in listing.json().get("resources") or []):
                serving.append(version)
        return serving

    async def node_event(self, node: str, reason: str, message: str, *, warning: bool = True,
                         namespace: str = "default") -> None:
        """A core/v1 Event about a Node (cluster-scoped objects' events live in `default`)."""
        await self.event({"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}, reason, message,
                         warning=warning, namespace=namespace)

    async def event(self, involved: dict[str, str], reason: str, message: str, *, warning: bool = True,
                    namespace: str = "default") -> None:
        """A core/v1 Event about any object (`involved`: apiVersion, kind, name, namespace?, uid?)."""
        import datetime as dt

        from lightkube.models.core_v1 import EventSource, ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Event
        now = dt.datetime.now(dt.UTC)
        event = Event(
            metadata=ObjectMeta(generateName=f"{involved['name']}.", namespace=involved.get("namespace") or namespace),
            involvedObject=ObjectReference(**involved),
            reason=reason, message=message, type="Warning" if warning else "Normal",
            source=EventSource(component="gpu-operator"), firstTimestamp=now, lastTimestamp=now, count=1,
        )
        self.write("create", "Event")
        await self.client.create(event)

    async def list_all(self, path: str, params: Mapping[str, str] | None = None, *,
                       slim_pods: bool = False) -> list[dict[str, Any]]:
        """Every item of the list at `path`, page by page (kube/pages.py)."""
        return await pages.list_all(self.http, path, params, slim_pods=slim_pods)

    async def count(self, path: str) -> int | None:
        """How many objects the list at `path` holds (one item fetched); None when not served."""
        return await pages.count(self.http, path)

    async def get_answer(self, path: str, params: Mapping[str, str] | None = None,
                         timeout: float | None = None) -> pages.Answer:
        """A GET of any path: its status and text, or why there was no answer (never raises for
        an HTTP status or a transport error)."""
        return await pages.get(self.http, path, params, timeout)

    async def evict(self, namespace: str, name: str) -> pages.Evicted:
        """The Eviction API for one pod; a PodDisruptionBudget's refusal is in the answer."""
        self.write("create", "Eviction")
        return await pages.evict(self.http, namespace, name)

    async def list_dicts(self, api_version: str, kind: str, namespace: str | None = None,
                         labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        res = resource_for(api_version, kind)
        kwargs: dict[str, Any] = {"labels": labels} if labels else {}
        if namespace:
            kwargs["namespace"] = namespace
        return [obj.to_dict() async for obj in self.client.list(res, **kwargs)]

    async def get_dict(self, api_version: str, kind: str, name: str,
                       namespace: str | None = None) -> dict[str, Any] | None:
        try:
            obj = await self.client.get(resource_for(api_version, kind), name, namespace=namespace)
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise
        return dict(obj.to_dict())

    async def server_version(self) -> str:
        """The apiserver's gitVersion without the leading v ("1.36.3"); /version has no resource type."""
        response = await self.http.get("/version")
        response.raise_for_status()
        return str(response.json().get("gitVersion", "")).lstrip("v")
