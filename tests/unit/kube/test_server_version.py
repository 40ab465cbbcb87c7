"""Kube.server_version reads /version through lightkube's public config and connection adapter
(no private attribute of lightkube's client): this fails when lightkube changes underneath."""

from __future__ import annotations

import asyncio

from aiohttp import web
from lightkube import KubeConfig
from lightkube.config.models import Cluster, User

from gpu_operator.kube.client import Kube
from tests.support.ports import free_port


def test_server_version_sends_the_credentials_and_strips_the_v() -> None:
    seen: list[str] = []

    async def version(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"major": "1", "minor": "36", "gitVersion": "v1.36.3"})

    async def scenario() -> str:
        app = web.Application()
        app.add_routes([web.get("/version", version)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        config = KubeConfig.from_one(
            cluster=Cluster(server=f"http://127.0.0.1:{port}"), user=User(token="s3cret")
        )
        kube = Kube(config=config)
        try:
            return await kube.server_version()
        finally:
            await kube.close()
            await runner.cleanup()

    assert asyncio.run(scenario()) == "1.36.3"
    assert seen == ["Bearer s3cret"]
