"""Who a stand-in is when it calls the apiserver: the identity its component has on a real node.

- A component's own calls (GFD's NodeFeature, the DRA plugin's ResourceSlices, the MIG manager's
  labels, our probe, vfio manager, health agent, vGPU host-state agent) go out with a token of the
  ServiceAccount its pod runs as (`spec.serviceAccountName`), requested as the kubelet mounts it:
  TokenRequest `serviceaccounts/<sa>/token`, bound to the pod (name and uid), for 3607 s, renewed
  once 80 % of its life is gone (kubelet pkg/kubelet/token/token_manager.go `requiresRefresh`).
  One client per pod (its uid); a new pod gets a new token, a pod gone loses its client.
- What the kubelet writes for a component (the device plugin's and virt-handler's resources in the
  Node's status, the cleanup after a pod went) goes out as the node's kubelet: a client
  certificate for `system:node:<node>` in `system:nodes` (the apiserver's Node authorizer), signed
  with the simulator's CA.

A call the apiserver refuses (403) is logged as one JSON object (`{"event": "refused",
"identity": …, "verb": …, "resource": …, …}`) and raised as it came: the work queue retries it
with backoff, as the component's own loop would. Nothing is widened: the stand-ins hold no other
credentials for these calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, Client, KubeConfig
from lightkube.core.exceptions import ApiError

log = logging.getLogger("gpu_operator.sim.standins")

TOKEN_SECONDS = 3607  # what the kubelet asks for a projected ServiceAccount token
REFRESH_AT = 0.8  # of the token's life: the kubelet renews then

# Identity kinds a stand-in declares (`Player.identity`): who makes its calls on a real node.
POD = "pod"  # its pod's ServiceAccount
KUBELET = "kubelet"  # the node's kubelet (system:node:<node>); its pod's SA for what it reads itself
NO_API = "none"  # it makes no API call (writes the host's files only)

# API verb of each client method (the audit log's `verb`; server-side apply is a patch).
VERBS = {
    "get": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "apply": "patch",
    "delete": "delete",
    "deletecollection": "deletecollection",
}


def service_account_user(namespace: str, account: str) -> str:
    return f"system:serviceaccount:{namespace}:{account}"


def node_user(node: str) -> str:
    return f"system:node:{node}"


def resource_name(res: Any) -> str:
    """The resource (and subresource) a call addresses, as the audit log names them: nodes/status."""
    info = getattr(res, "_api_info", None)
    if info is None:
        return str(getattr(res, "__name__", res))
    action = getattr(info, "action", None)
    return f"{info.plural}/{action}" if action else str(info.plural)


@dataclass(frozen=True)
class Refusal:
    """A call the apiserver refused (403), as the stand-in logged it."""

    identity: str
    verb: str
    resource: str
    namespace: str
    name: str
    message: str

    def record(self) -> dict[str, str]:
        return {
            "event": "refused",
            "identity": self.identity,
            "verb": self.verb,
            "resource": self.resource,
            "namespace": self.namespace,
            "name": self.name,
            "message": self.message,
        }


class Refusals:
    """The refusals seen (the latest 1,000), each distinct one logged once as a JSON line."""

    def __init__(self) -> None:
        self.seen: deque[Refusal] = deque(maxlen=1000)
        self.logged: set[tuple[str, str, str, str, str]] = set()

    def add(self, refusal: Refusal) -> None:
        self.seen.append(refusal)
        key = (refusal.identity, refusal.verb, refusal.resource, refusal.namespace, refusal.name)
        if key not in self.logged:
            self.logged.add(key)
            log.warning("%s", json.dumps(refusal.record(), sort_keys=True))


def _call_target(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, str, str]:
    """(resource, namespace, name) of a client call."""
    first = args[0] if args else kwargs.get("res") or kwargs.get("obj")
    res = first if isinstance(first, type) else type(first)
    meta = getattr(first, "metadata", None) if not isinstance(first, type) else None
    name = kwargs.get("name") or (args[1] if len(args) > 1 and isinstance(args[1], str) else None)
    name = name or (getattr(meta, "name", None) if meta is not None else None) or ""
    namespace = (
        kwargs.get("namespace") or (getattr(meta, "namespace", None) if meta is not None else None) or ""
    )
    return res, str(namespace), str(name)


class _Guard:
    """The calls of one identity's client: a 403 is recorded (`Refusals`) and raised as it came."""

    def __init__(self, inner: Any, identity: str, refusals: Refusals) -> None:
        self._inner, self.identity, self._refusals = inner, identity, refusals

    def _refused(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], err: Exception) -> None:
        if isinstance(err, ApiError) and err.status.code == 403:
            res, namespace, name = _call_target(method, args, kwargs)
            self._refusals.add(
                Refusal(
                    self.identity,
                    VERBS.get(method, method),
                    resource_name(res),
                    namespace,
                    name,
                    str(err.status.message or ""),
                )
            )

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


class GuardedAsyncClient(_Guard):
    """An AsyncClient whose refusals are recorded (same methods)."""

    def __getattr__(self, attr: str) -> Any:
        target = getattr(self._inner, attr)
        if attr in ("list", "watch"):
            return lambda *a, **k: _AsyncStream(self, attr, a, k, target(*a, **k))
        if attr not in VERBS:
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return await target(*args, **kwargs)
            except ApiError as err:
                self._refused(attr, args, kwargs, err)
                raise

        return call


class _AsyncStream:
    """A list or watch of a guarded client (keeps the inner one's attributes: resourceVersion)."""

    def __init__(
        self, guard: _Guard, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], inner: Any
    ) -> None:
        self._guard, self._method, self._args, self._kwargs, self._inner = guard, method, args, kwargs, inner

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            async for item in self._inner:
                yield item
        except ApiError as err:
            self._guard._refused(self._method, self._args, self._kwargs, err)
            raise


class GuardedClient(_Guard):
    """A (sync) Client whose refusals are recorded: the node agents' own code takes one."""

    def __getattr__(self, attr: str) -> Any:
        target = getattr(self._inner, attr)
        if attr not in VERBS:
            return target
        if attr in ("list", "watch"):

            def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
                try:
                    yield from target(*args, **kwargs)
                except ApiError as err:
                    self._refused(attr, args, kwargs, err)
                    raise

            return stream

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return target(*args, **kwargs)
            except ApiError as err:
                self._refused(attr, args, kwargs, err)
                raise

        return call


class NoCalls:
    """What a stand-in that makes no API call is handed instead of a client: any call is a defect."""

    def __init__(self, app: str) -> None:
        self.app = app

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(
            f"the stand-in for app={self.app} declares no API calls (identity {NO_API!r}) "
            f"but called {attr}: declare its identity in its Player"
        )


@dataclass
class _PodToken:
    identity: str
    token: str
    renew_at: float
    clients: dict[tuple[str, str], Any]  # (kind, field manager) -> client


class Identities:
    """Clients per identity: a pod's ServiceAccount token (TokenRequest bound to the pod), a node's
    kubelet certificate. `admin` (the simulator's own client) only requests the tokens."""

    def __init__(self, admin: AsyncClient, config: KubeConfig, pki_dir: Path | None = None) -> None:
        self.admin = admin
        single = config.get()
        assert single is not None, "the stand-ins' kubeconfig has no current context"
        self.server = single.cluster.server
        ca = single.cluster.certificate_auth
        self.ca = str(single.abs_file(ca)) if ca else None
        self.ca_data = single.cluster.certificate_auth_data
        self.pki_dir = pki_dir if pki_dir is not None else (Path(self.ca).parent if self.ca else None)
        self.pods: dict[str, _PodToken] = {}
        self.nodes: dict[tuple[str, str], Any] = {}
        self.refusals = Refusals()
        self._locks: dict[str, asyncio.Lock] = {}  # per pod: one TokenRequest at a time for it

    def _config(self, user: dict[str, Any]) -> KubeConfig:
        cluster: dict[str, Any] = {"server": self.server}
        if self.ca:
            cluster["certificate-authority"] = self.ca
        elif self.ca_data:
            cluster["certificate-authority-data"] = self.ca_data
        return KubeConfig.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sim", "cluster": cluster}],
                "users": [{"name": "id", "user": user}],
                "contexts": [{"name": "id", "context": {"cluster": "sim", "user": "id"}}],
                "current-context": "id",
            }
        )

    async def _token(self, pod: Any) -> _PodToken:
        from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
        from lightkube.resources.core_v1 import ServiceAccountToken

        account = pod.service_account or "default"
        from lightkube.models.meta_v1 import ObjectMeta

        request = ServiceAccountToken(
            metadata=ObjectMeta(namespace=pod.namespace),
            spec=TokenRequestSpec(
                audiences=[],
                expirationSeconds=TOKEN_SECONDS,
                boundObjectRef=BoundObjectReference(kind="Pod", apiVersion="v1", name=pod.name, uid=pod.uid),
            ),
        )
        got = await self.admin.create(request, account, namespace=pod.namespace)
        assert got.status is not None and got.status.token
        return _PodToken(
            service_account_user(pod.namespace, account),
            got.status.token,
            time.monotonic() + TOKEN_SECONDS * REFRESH_AT,
            {},
        )

    async def _pod(self, pod: Any) -> _PodToken:
        async with self._locks.setdefault(pod.uid, asyncio.Lock()):
            held = self.pods.get(pod.uid)
            if held is None or time.monotonic() >= held.renew_at:
                fresh = await self._token(pod)
                if held is not None:
                    await _close_all(held.clients.values())
                self.pods[pod.uid] = held = fresh
            return held

    async def for_pod(self, pod: Any, field_manager: str) -> GuardedAsyncClient:
        """An AsyncClient with the pod's ServiceAccount token (raises the TokenRequest's ApiError:
        e.g. 404 once the pod is gone)."""
        held = await self._pod(pod)
        key = ("async", field_manager)
        if key not in held.clients:
            held.clients[key] = GuardedAsyncClient(
                AsyncClient(self._config({"token": held.token}), field_manager=field_manager),
                held.identity,
                self.refusals,
            )
        return held.clients[key]  # type: ignore[no-any-return]

    async def sync_for_pod(self, pod: Any, field_manager: str) -> GuardedClient:
        """A (sync) Client with the pod's token, for the node agents' own code."""
        held = await self._pod(pod)
        key = ("sync", field_manager)
        if key not in held.clients:
            held.clients[key] = GuardedClient(
                Client(self._config({"token": held.token}), field_manager=field_manager),
                held.identity,
                self.refusals,
            )
        return held.clients[key]  # type: ignore[no-any-return]

    async def _kubelet_config(self, node: str) -> KubeConfig:
        if self.pki_dir is None or not (self.pki_dir / "ca.key").exists():
            raise RuntimeError(
                f"no CA key under {self.pki_dir} to sign the kubelet certificate of node {node}"
            )
        from gpu_operator.sim.plane import pki as pki_mod

        pki = pki_mod.Pki(self.pki_dir)
        name = f"kubelet-{node}"
        if not pki.client_cert(name).exists():
            await asyncio.to_thread(pki_mod.issue_client_cert, pki, name, node_user(node), ["system:nodes"])
        return self._config(
            {"client-certificate": str(pki.client_cert(name)), "client-key": str(pki.client_key(name))}
        )

    async def kubelet(self, node: str, field_manager: str) -> GuardedAsyncClient:
        """An AsyncClient as the node's kubelet (system:node:<node>, group system:nodes)."""
        key = (node, field_manager)
        if key not in self.nodes:
            config = await self._kubelet_config(node)
            self.nodes[key] = GuardedAsyncClient(
                AsyncClient(config, field_manager=field_manager), node_user(node), self.refusals
            )
        return self.nodes[key]  # type: ignore[no-any-return]

    async def sync_kubelet(self, node: str, field_manager: str) -> GuardedClient:
        """A (sync) Client as the node's kubelet."""
        key = (node, f"sync:{field_manager}")
        if key not in self.nodes:
            config = await self._kubelet_config(node)
            self.nodes[key] = GuardedClient(
                Client(config, field_manager=field_manager), node_user(node), self.refusals
            )
        return self.nodes[key]  # type: ignore[no-any-return]

    async def sync_for_pods(self, node: str, pods: list[Any], field_manager: str) -> GuardedClient:
        """The newest of `pods`' ServiceAccount (sync) client; the node's kubelet once none is left."""
        ordered = sorted(pods, key=lambda p: (p.running, p.started, p.name))
        if ordered:
            try:
                return await self.sync_for_pod(ordered[-1], field_manager)
            except ApiError as err:
                if err.status.code not in (403, 404):
                    raise
        return await self.sync_kubelet(node, field_manager)

    def kubelet_lazy(self, node: str, field_manager: str) -> LazyClient:
        """The node's kubelet client, its certificate signed only at its first call."""
        return LazyClient(lambda: self.kubelet(node, field_manager))

    def forget(self, uid: str) -> None:
        """The pod went: its token and clients too."""
        held = self.pods.pop(uid, None)
        self._locks.pop(uid, None)
        if held is not None:
            with_loop = asyncio.get_running_loop()
            with_loop.create_task(_close_all(held.clients.values()))

    async def close(self) -> None:
        for held in self.pods.values():
            await _close_all(held.clients.values())
        await _close_all(self.nodes.values())
        self.pods.clear()
        self.nodes.clear()


class LazyClient:
    """An AsyncClient made at its first call (`make` is awaited once)."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._client: Any = None

    async def _get(self) -> Any:
        if self._client is None:
            self._client = await self._make()
        return self._client

    def __getattr__(self, attr: str) -> Any:
        if attr in ("list", "watch"):

            async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                async for item in getattr(await self._get(), attr)(*args, **kwargs):
                    yield item

            return stream

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await getattr(await self._get(), attr)(*args, **kwargs)

        return call


async def _close_all(clients: Any) -> None:
    for client in list(clients):
        inner = getattr(client, "_inner", client)
        closing = getattr(inner, "close", None)
        if closing is None:
            continue
        result = closing()
        if asyncio.iscoroutine(result):
            await result
