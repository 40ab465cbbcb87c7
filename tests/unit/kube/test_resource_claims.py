"""Kube.list_resource_claims reads the newest resource.k8s.io version the apiserver serves, and says
None (not an error) where it serves none: our 1.29 floor has no DRA by default."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from aiohttp import web
from lightkube import KubeConfig
from lightkube.config.models import Cluster, User

from gpu_operator.kube.client import Kube
from tests.support.ports import free_port

CLAIM = {"metadata": {"name": "c", "namespace": "work"}}


def _claims(served: dict[str, int]) -> tuple[list[dict[str, object]] | None | BaseException, list[str]]:
    """What list_resource_claims("work") answers from an apiserver whose resourceclaims list at each
    version answers the status in `served` (200: one claim; a version not named: 404)."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.path)
        version = request.path.split("/")[3]
        status = served.get(version, 404)
        if status == 200:
            return web.json_response({"kind": "ResourceClaimList", "metadata": {}, "items": [CLAIM]})
        return web.json_response({"kind": "Status", "code": status}, status=status)

    async def scenario() -> list[dict[str, object]] | None | BaseException:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        kube = Kube(
            config=KubeConfig.from_one(cluster=Cluster(server=f"http://127.0.0.1:{port}"), user=User())
        )
        try:
            return await kube.list_resource_claims("work")
        except httpx2.HTTPStatusError as err:
            return err
        finally:
            await kube.close()
            await runner.cleanup()

    return asyncio.run(scenario()), seen


def test_the_newest_served_version_is_read() -> None:
    claims, seen = _claims({"v1": 200, "v1beta1": 200})
    assert claims == [CLAIM]
    assert seen == ["/apis/resource.k8s.io/v1/namespaces/work/resourceclaims"]


def test_an_older_version_is_read_where_v1_is_not_served() -> None:
    claims, seen = _claims({"v1beta1": 200})
    assert claims == [CLAIM]
    assert [p.split("/")[3] for p in seen] == ["v1", "v1beta2", "v1beta1"]


def test_none_where_no_version_is_served() -> None:
    assert _claims({})[0] is None


@pytest.mark.parametrize("status", [403, 500])
def test_a_refusal_is_an_error_not_an_absent_api(status: int) -> None:
    answer, _ = _claims({"v1": status})
    assert isinstance(answer, httpx2.HTTPStatusError) and answer.response.status_code == status
