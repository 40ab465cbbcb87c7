"""Start-up discovery: the cluster facts the operator reads once before its loops start (the
Kubernetes version, OpenShift, which optional CRDs are served), retried until the apiserver answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from gpu_operator.controllers.settings import Backoff
from gpu_operator.kube.client import Kube
from gpu_operator.kube.platform import platform_name, read_openshift_version
from gpu_operator.vocabulary import NODE_FEATURE_GROUP, NODE_FEATURE_PLURAL

log = logging.getLogger("gpu_operator.operator")


class DiscoveryError(RuntimeError):
    """A start-up fact could not be read from the apiserver."""


@dataclass(frozen=True)
class ClusterInfo:
    """Cluster facts read once at start: the Kubernetes version (rendering depends on it), the
    platform (OpenShift and its version: kube/platform.py, the signal NVIDIA's operator reads) and
    which optional CRDs are served (a CRD installed later is seen at the next start)."""

    k8s_version: str = ""
    servicemonitor_crd: bool = False
    node_feature_crd: bool = False
    openshift_version: str = ""  # "" where the cluster is not OpenShift

    @property
    def openshift(self) -> bool:
        return bool(self.openshift_version)

    @classmethod
    async def read(cls, kube: Kube) -> ClusterInfo:
        version = await kube.server_version()
        if not version:
            raise DiscoveryError("GET /version answered without a gitVersion")
        monitors = await kube.get_dict(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", "servicemonitors.monitoring.coreos.com"
        )
        features = await kube.get_dict(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            f"{NODE_FEATURE_PLURAL}.{NODE_FEATURE_GROUP}",
        )
        return cls(version, monitors is not None, features is not None, await read_openshift_version(kube))

    @classmethod
    async def discover(cls, kube: Kube, stop: asyncio.Event, backoff: Backoff) -> ClusterInfo | None:
        """Read until it answers: failures are logged with their reason and retried with backoff
        (there is no made-up fallback; the process stays not ready meanwhile). None when stop was
        set first."""
        failures = 0
        while not stop.is_set():
            try:
                info = await cls.read(kube)
            except Exception as err:
                failures += 1
                delay = backoff.delay(failures)
                log.warning(
                    "start-up discovery failed (GET /version, the ServiceMonitor and NodeFeature CRDs, "
                    "OpenShift's ClusterVersion): %s; not starting the loops, retrying in %.0f s",
                    err,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                continue
            log.info(
                "Kubernetes %s; platform %s; ServiceMonitor CRD %s; NodeFeature CRD %s",
                info.k8s_version,
                platform_name(info.openshift_version),
                "present" if info.servicemonitor_crd else "absent",
                "present" if info.node_feature_crd else "absent",
            )
            return info
        return None
