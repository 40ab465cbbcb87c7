"""The operator's endpoints: /metrics from prometheus-client's own aiohttp handler, /healthz, /readyz."""

from __future__ import annotations

import asyncio

import aiohttp

from gpu_operator.controllers import metrics
from tests.support.ports import free_port


def test_metrics_health_and_readiness_endpoints() -> None:
    async def scenario() -> None:
        ready = asyncio.Event()
        metrics_port, health_port = free_port(), free_port()
        runners = await metrics.serve(f"127.0.0.1:{metrics_port}", f"127.0.0.1:{health_port}", ready.is_set)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                    assert response.status == 200
                    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    body = await response.text()
                assert "# TYPE gpu_operator_reconciliation_status gauge" in body
                assert "# TYPE gpu_operator_api_write_requests_total counter" in body
                async with http.get(f"http://127.0.0.1:{metrics_port}/healthz") as response:
                    assert response.status == 404  # probes live on their own address
                async with http.get(f"http://127.0.0.1:{health_port}/healthz") as response:
                    assert (response.status, await response.text()) == (200, "ok")
                async with http.get(f"http://127.0.0.1:{health_port}/readyz") as response:
                    assert response.status == 503
                ready.set()
                async with http.get(f"http://127.0.0.1:{health_port}/readyz") as response:
                    assert response.status == 200
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(scenario())


def test_address_zero_turns_an_endpoint_off() -> None:
    async def scenario() -> int:
        runners = await metrics.serve("0", "", lambda: True)
        return len(runners)

    assert asyncio.run(scenario()) == 0
