"""`gpu-operator run`: wires leader election, metrics/health endpoints and the operator loops."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from lightkube.core.exceptions import ApiError

from gpu_operator.controllers import metrics
from gpu_operator.controllers.apihealth import ApiHealth
from gpu_operator.controllers.environment import Environment
from gpu_operator.controllers.leader import LEASE_NAME, LeaderElector, identity
from gpu_operator.controllers.manager import Manager
from gpu_operator.controllers.settings import OperatorSettings
from gpu_operator.kube.client import Kube

log = logging.getLogger("gpu_operator")


async def run(
    environment: Environment,
    kubeconfig: str | None,
    leader_elect: bool,
    metrics_address: str,
    health_address: str,
    settings: OperatorSettings | None = None,
) -> int:
    settings = settings or OperatorSettings()
    namespace = environment.namespace
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's login reads it
    stop = asyncio.Event()
    take_signals(stop)

    kube = Kube(kubeconfig)
    ready = asyncio.Event()
    # A replica waiting for the Lease is ready too (to take over): otherwise a rolling update of a
    # one-replica Deployment (maxUnavailable 0) waits forever for the new pod, which waits for the
    # old pod's Lease, and the old operator keeps running.
    standby = asyncio.Event()
    health = ApiHealth(kube, period=settings.apiserver_probe_period)
    prober = asyncio.create_task(health.watch(stop), name="apiserver-probe")
    runners = await metrics.serve(
        metrics_address, health_address, lambda: (ready.is_set() or standby.is_set()) and health.ok
    )
    elector = None
    try:
        if leader_elect:
            elector = LeaderElector(
                kube.lease_client(namespace, LEASE_NAME), namespace, identity(), settings=settings
            )
            kube.fence = elector.leading
            standby.set()
            acquired = await elector.acquire(stop)
            standby.clear()
            if not acquired:
                return 0
            keeper = asyncio.create_task(elector.keep(stop), name="leader-renewal")
        metrics.LEADER.set(1)
        operator = Manager(kube, environment, settings)
        log.info("operator starting in namespace %s", namespace)
        # kopf puts its own SIGTERM/SIGINT handlers in at its start; they stop kopf but not the
        # units, the reflector and the Lease keeper, which kopf then waits for (5 s) and cancels
        await operator.run(stop, ready, on_kopf_started=lambda: take_signals(stop))
        if leader_elect:
            keeper.cancel()
        return 0
    finally:
        metrics.LEADER.set(0)
        prober.cancel()
        if elector is not None:
            await elector.release(delete=await nothing_to_lead(kube, timeout=5.0))
        for runner in runners:
            await runner.cleanup()
        await kube.close()
        log.info("operator stopped")


def take_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stop`, which every task of the operator (kopf's too) watches."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stopper(stop, sig))


def _stopper(stop: asyncio.Event, sig: signal.Signals):  # type: ignore[no-untyped-def]
    def handler() -> None:
        log.info("received %s: shutting down", sig.name)
        stop.set()

    return handler


async def nothing_to_lead(kube: Kube, timeout: float) -> bool:
    """No ClusterPolicy or NVIDIADriver is left (or their CRDs are gone): an uninstall, whose
    pre-delete hook deleted them before the operator was stopped. False when it cannot tell."""
    from gpu_operator.controllers.cleanup import OWNER_KINDS

    for api_version, kind in OWNER_KINDS:
        try:
            if await asyncio.wait_for(kube.list_dicts(api_version, kind), timeout):
                return False
        except ApiError as err:
            if err.status.code != 404:
                return False
        except Exception:  # the apiserver is unreachable: keep the Lease, as a plain release would
            return False
    return True
