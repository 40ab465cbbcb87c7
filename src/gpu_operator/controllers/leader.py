"""Lease-based leader election (coordination.k8s.io/v1), compatible with client-go's lock records."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
import sys
import uuid
from dataclasses import dataclass, field

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import WRITES, NotLeading

log = logging.getLogger("gpu_operator.leader")

LEASE_NAME = "53822513.nvidia.com"  # upstream's election ID: one leader across both implementations


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass
class LeaderElector:
    client: AsyncClient
    namespace: str
    identity: str
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    name: str = LEASE_NAME
    renewed_at: float | None = None
    """Monotonic time at which the last successful take-or-renew attempt started."""
    expires_in: float | None = None
    """When another replica holds the lease: seconds until it expires, as last read."""

    @property
    def lease_duration(self) -> float:
        return self.settings.leader_lease_duration

    @property
    def renew_deadline(self) -> float:
        return self.settings.leader_renew_deadline

    @property
    def retry_period(self) -> float:
        return self.settings.leader_retry_period

    async def _try(self) -> bool:
        """One attempt to acquire or renew; True when we hold the lease afterwards."""
        now = _now()
        read_from = asyncio.get_running_loop().time()
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as err:
            if err.status.code != 404:
                raise
            WRITES.labels("create", "Lease").inc()
            await self.client.create(
                Lease(
                    metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=self._spec(now, transitions=0, acquired=now),
                )
            )
            return True
        took = asyncio.get_running_loop().time() - read_from
        if took > self.retry_period:
            # Paused (SIGSTOP, a frozen VM) or stalled while reading: the Lease may have changed
            # hands since, so a renewal from this read would only be refused (409). Read again.
            log.info("leader election: the Lease read took %.1f s; reading it again before renewing", took)
            return False
        spec = lease.spec or LeaseSpec()
        holder = spec.holderIdentity or ""
        renewed = spec.renewTime or spec.acquireTime
        duration = spec.leaseDurationSeconds or int(self.lease_duration)
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder and holder != self.identity and not expired:
            self.expires_in = duration - (now - renewed).total_seconds() if renewed else None
            return False
        transitions = (spec.leaseTransitions or 0) + (0 if holder == self.identity else 1)
        acquired = spec.acquireTime if holder == self.identity and spec.acquireTime else now
        lease.spec = self._spec(now, transitions=transitions, acquired=acquired)
        WRITES.labels("update", "Lease").inc()
        # replace() carries the resourceVersion: two candidates racing for an expired lease
        # cannot both win (the loser gets 409 Conflict).
        await self.client.replace(lease)
        return True

    def _spec(self, now: dt.datetime, transitions: int, acquired: dt.datetime) -> LeaseSpec:
        return LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_duration),
            acquireTime=acquired,
            renewTime=now,
            leaseTransitions=transitions,
        )

    def leading(self) -> bool:
        """The write fence: True only while the lease we last renewed cannot have run out. A
        follower takes it no sooner than lease duration after our renewal, so we stop writing one
        retry period before that (a margin for latency and clock skew). A leader paused past it
        (SIGSTOP, a frozen VM) sends nothing when it resumes, whatever its loops had queued, until
        it has renewed the lease again; its renewal loop then stops it if the lease was taken."""
        if self.renewed_at is None:
            return False
        age = asyncio.get_running_loop().time() - self.renewed_at
        return age < self.lease_duration - self.retry_period

    async def _attempt(self) -> bool:
        started = asyncio.get_running_loop().time()
        self.expires_in = None
        try:
            if await self._try():
                self.renewed_at = started
                return True
            return False
        except ApiError as err:
            if err.status.code == 409:
                return False
            log.warning("leader election: %s", err.status.message)
            return False
        except Exception as err:  # network trouble: keep trying until the deadline says otherwise
            log.warning("leader election: %s", err)
            return False

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until we lead (True) or stop is set (False)."""
        log.info("leader election: %s waiting for lease %s/%s", self.identity, self.namespace, self.name)
        while not stop.is_set():
            if await self._attempt():
                log.info("leader election: %s became the leader", self.identity)
                return True
            # Try again after the retry period, or just after the holder's lease runs out if
            # that comes sooner (a killed leader is replaced as soon as its lease allows).
            wait = self.retry_period
            if self.expires_in is not None:
                wait = min(wait, max(0.05, self.expires_in + 0.05))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew until stop is set; returns (having set stop) when leadership is lost."""
        last_renewal = asyncio.get_running_loop().time()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.retry_period)
                break
            except TimeoutError:
                pass
            if await self._attempt():
                last_renewal = asyncio.get_running_loop().time()
            elif asyncio.get_running_loop().time() - last_renewal > self.renew_deadline:
                log.error("leader election: lost the lease %s; stopping", self.name)
                stop.set()
                return

    async def release(self, delete: bool = False) -> None:
        """Give the lease up at a clean shutdown so a follower takes over at once; with `delete`
        (an uninstall: nothing left to lead), delete the Lease instead."""
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            if delete and lease.spec and lease.spec.holderIdentity == self.identity:
                WRITES.labels("delete", "Lease").inc()
                await self.client.delete(Lease, self.name, namespace=self.namespace)
                log.info(
                    "leader election: deleted lease %s (no ClusterPolicy or NVIDIADriver left)", self.name
                )
            elif lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = ""
                lease.spec.renewTime = _now() - dt.timedelta(seconds=self.lease_duration + 1)
                WRITES.labels("update", "Lease").inc()
                await self.client.replace(lease)
                log.info("leader election: released lease %s", self.name)
        except Exception as err:
            log.warning("leader election: could not release the lease: %s", err)


def log_pass_failure(log: logging.Logger, what: str, failures: int, retry_in: float) -> None:
    """Inside an except block: a loop's failed pass, with its traceback, except a write the
    leader fence refused (expected after a pause: the renewal loop decides what happens next)."""
    err = sys.exc_info()[1]
    if isinstance(err, NotLeading):
        log.warning("%s (%d in a row): %s; retrying in %.0f s", what, failures, err, retry_in)
    else:
        log.exception("%s (%d in a row); retrying in %.0f s", what, failures, retry_in)
