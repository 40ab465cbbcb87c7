"""What the chart's RBAC tests drive (tests/integration/test_chart_rbac.py): the chart's RBAC as
installed (`Installed`: what its ServiceAccount may do, by SelfSubjectAccessReview), a plain-HTTP
reverse proxy in front of the apiserver that streams responses (watches included) and records the
status of each, what they ask it (the refusals, whether the operator still runs, its Lease
renewals), and `gpu-operator run` started and stopped as the chart's ServiceAccount through it."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from yarl import URL

from gpu_operator.sim.plane.controlplane import free_port
from tests.support.permissions import Permission


@dataclass
class Installed:
    objects: list[dict[str, Any]]
    kubeconfig: Path
    client: Client

    def can(self, permission: Permission, namespace: str | None) -> bool:
        group, resource, verb, name = permission
        main, _, sub = resource.partition("/")
        review = SelfSubjectAccessReview(
            spec=SelfSubjectAccessReviewSpec(
                resourceAttributes=ResourceAttributes(
                    group=group,
                    resource=main,
                    subresource=sub or None,
                    verb=verb,
                    name=name,
                    namespace=namespace,
                )
            )
        )
        answer = self.client.create(review)
        return bool(answer.status and answer.status.allowed)


def apply_all(kube: Client, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        kube.apply(from_dict(obj), force=True)


# The apiserver counts neither authorization denials in its metrics nor reads in this audit
# policy, so the operator talks to it through this proxy, which records every response it gets.
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


@dataclass
class Response:
    method: str
    path: str
    status: int


class RecordingProxy:
    """A plain-HTTP reverse proxy in front of the apiserver that streams responses (watches
    included) and records the status of each."""

    def __init__(self, upstream: str, ca: Path) -> None:
        self.upstream, self.ca, self.port = upstream, ca, free_port()
        self.responses: list[Response] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="recording-proxy", daemon=True)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        assert self._ready.wait(30), "the recording proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(90)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def forbidden(self) -> list[Response]:
        return [r for r in list(self.responses) if r.status == 403]

    def kubeconfig(self, path: Path, token: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {"token": token}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, shutdown_timeout=2.0)  # open watches: do not wait 60 s for them
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        await self._session.close()  # ends the upstream watches, so their handlers return
        await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_HEADERS and (body or k.lower() != "content-type")
        }
        url = URL(self.upstream + str(request.rel_url), encoded=True)
        async with self._session.request(request.method, url, headers=headers, data=body or None) as up:
            self.responses.append(Response(request.method, request.rel_url.path, up.status))
            response = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the operator hung up (a watch it stopped, or its exit)
            return response


@dataclass
class OperatorRun:
    proxy: RecordingProxy
    start: Callable[[], subprocess.Popen[bytes]]


def refusals(proxy: RecordingProxy) -> str:
    refused = sorted({f"{r.method} {r.path}" for r in proxy.forbidden()})
    return (
        f"the API server refused the operator {len(proxy.forbidden())} time(s): {refused}. Namespaced "
        "kinds are meant to be read in the operator's namespace only; grant more in "
        "deployments/gpu-operator/templates/rbac.yaml only for what the operator truly needs"
    )


def running(process: subprocess.Popen[bytes], proxy: RecordingProxy) -> None:
    assert process.poll() is None, f"the operator exited with {process.returncode}; " + refusals(proxy)


def lease_renewals(proxy: RecordingProxy) -> int:
    return sum(1 for r in list(proxy.responses) if r.method == "PUT" and "/leases/" in r.path)


def start_operator(kubeconfig: Path, namespace: str, log: Path) -> subprocess.Popen[bytes]:
    """`gpu-operator run` with leader election through `kubeconfig`, its output in `log`."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "OPERATOR_NAMESPACE": namespace}
    argv = [
        sys.executable,
        "-m",
        "gpu_operator.cli",
        "run",
        "--namespace",
        namespace,
        "--leader-elect",
        "--metrics-bind-address",
        f"127.0.0.1:{free_port()}",
        "--health-probe-bind-address",
        f"127.0.0.1:{free_port()}",
    ]
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop_operators(started: list[subprocess.Popen[bytes]]) -> None:
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
