"""The leader-election write fence: Kube.write refuses every write once the lease this replica
last renewed may have run out, and the follower's retry waits for the holder's lease to end."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, cast

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from prometheus_client import REGISTRY

from gpu_operator.controllers.leader import LeaderElector
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import Kube, NotLeading

SETTINGS = OperatorSettings.with_renew_deadline(3.0)  # lease 8 s, retry 2 s: fence closes 6 s after renewal


class LeaseStore:
    """Just enough of AsyncClient for Lease get/create/replace, with one holder at a time."""

    def __init__(self, lease: Lease | None = None) -> None:
        self.lease = lease

    async def get(self, *_: Any, **__: Any) -> Lease:
        if self.lease is None:
            from lightkube.core.exceptions import ApiError

            raise ApiError(response=_NotFound())  # type: ignore[arg-type]
        return self.lease

    async def create(self, lease: Lease) -> None:
        self.lease = lease

    async def replace(self, lease: Lease) -> None:
        self.lease = lease


class _NotFound:
    status_code = 404

    def json(self) -> dict[str, Any]:
        return {"code": 404, "message": "not found", "reason": "NotFound"}


def written() -> float:
    return (
        REGISTRY.get_sample_value("gpu_operator_api_write_requests_total", {"verb": "patch", "kind": "Node"})
        or 0.0
    )


def _elector(store: LeaseStore) -> LeaderElector:
    return LeaderElector(cast(AsyncClient, store), "ns", "me", settings=SETTINGS)


def test_writes_pass_while_the_lease_is_fresh_and_are_refused_once_it_may_have_run_out() -> None:
    async def run() -> None:
        elector = _elector(LeaseStore())
        kube = Kube(
            config=KubeConfig.from_one(cluster=Cluster(server="http://127.0.0.1:9"), user=User(token="t"))
        )
        kube.fence = elector.leading
        with pytest.raises(NotLeading):
            kube.write("patch", "Node")  # before any renewal: not the leader
        assert await elector._attempt()
        before = written()
        kube.write("patch", "Node")
        assert written() == before + 1
        assert elector.renewed_at is not None
        elector.renewed_at -= (
            SETTINGS.leader_lease_duration - SETTINGS.leader_retry_period
        )  # paused that long
        with pytest.raises(NotLeading, match="Lease may have run out"):
            kube.write("patch", "Node")
        assert written() == before + 1  # refused writes are not counted

    asyncio.run(run())


def test_a_refused_follower_knows_when_the_holders_lease_ends() -> None:
    renewed = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    held = Lease(
        metadata=ObjectMeta(name="l", namespace="ns"),
        spec=LeaseSpec(holderIdentity="other", leaseDurationSeconds=8, renewTime=renewed),
    )

    async def run() -> None:
        elector = _elector(LeaseStore(held))
        assert not await elector._attempt()
        assert elector.expires_in is not None and 2.5 < elector.expires_in <= 3.0
        assert not elector.leading()

    asyncio.run(run())


class SlowRead(LeaseStore):
    """A Lease read that returns only after `delay` seconds (a pause or a stalled line), counting
    renewals sent."""

    def __init__(self, lease: Lease, delay: float) -> None:
        super().__init__(lease)
        self.delay, self.replaced = delay, 0

    async def get(self, *args: Any, **kwargs: Any) -> Lease:
        await asyncio.sleep(self.delay)
        return await super().get(*args, **kwargs)

    async def replace(self, lease: Lease) -> None:
        self.replaced += 1
        await super().replace(lease)


def test_a_renewal_is_not_sent_from_a_lease_read_older_than_the_retry_period() -> None:
    ours = Lease(
        metadata=ObjectMeta(name="l", namespace="ns"),
        spec=LeaseSpec(holderIdentity="me", leaseDurationSeconds=8, renewTime=dt.datetime.now(dt.UTC)),
    )
    fast = OperatorSettings(leader_retry_period=0.2)

    async def run(delay: float) -> int:
        store = SlowRead(ours, delay)
        elector = LeaderElector(cast(AsyncClient, store), "ns", "me", settings=fast)
        await elector._attempt()
        return store.replaced

    assert asyncio.run(run(0.0)) == 1  # a prompt read renews
    assert asyncio.run(run(0.5)) == 0  # a read older than the retry period is read again, not renewed


def test_a_fenced_write_is_logged_as_a_warning_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from gpu_operator.controllers.leader import log_pass_failure

    logger = logging.getLogger("test.fence")
    for err in (NotLeading("not sending PATCH /api/v1/nodes/n"), RuntimeError("boom")):
        try:
            raise err
        except Exception:
            log_pass_failure(logger, "node labelling failed", 1, 1.0)
    fenced, other = caplog.records
    assert (fenced.levelname, fenced.exc_info) == ("WARNING", None) and "not sending" in fenced.getMessage()
    assert other.levelname == "ERROR" and other.exc_info is not None
