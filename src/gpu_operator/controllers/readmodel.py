"""The one read model the units share: what the watches hold, one typed view per kind, and the
queries over them (controllers/queries.py) answered in one place.

Filled by the Node reflector (nodes) and kopf's indices (our CRs, driver pods, owned objects,
GPU feature discovery's NodeFeatures), and by start-up discovery (`ClusterInfo`: facts that cost
one request at start). Units read it; only the manager's watches write it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.api.gpucluster import GROUP as GPUCLUSTER_GROUP
from gpu_operator.api.gpucluster import KIND as GPUCLUSTER_KIND
from gpu_operator.api.gpucluster import SINGLETON
from gpu_operator.api.gpucluster import VERSION as GPUCLUSTER_VERSION
from gpu_operator.api.healthpolicy import HealthSpec
from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.controllers.nodelabels import NodeDriver
from gpu_operator.controllers.queries import active_policy, node_drivers, parse_drivers
from gpu_operator.controllers.settings import Backoff
from gpu_operator.controllers.views import (
    OWNED_KINDS,
    ClusterPolicyView,
    DriverPodView,
    GPUClusterView,
    NodeView,
    NVIDIADriverView,
    OwnedKind,
    OwnedView,
    first,
)
from gpu_operator.kube.client import Kube
from gpu_operator.kube.configwatch import content_hash
from gpu_operator.kube.platform import platform_name, read_openshift_version
from gpu_operator.vocabulary import NODE_FEATURE_GROUP, NODE_FEATURE_PLURAL

log = logging.getLogger("gpu_operator.operator")

# kopf's index ids, by what they hold
POLICIES, DRIVERS, GPUCLUSTERS, DRIVER_PODS, GFD_FEATURES = (
    "policies", "drivers", "gpuclusters", "driver_pods", "gfd_features")


def owned_index(kind: OwnedKind) -> str:
    return f"owned_{kind.plural}"


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
        monitors = await kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                       "servicemonitors.monitoring.coreos.com")
        features = await kube.get_dict("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                       f"{NODE_FEATURE_PLURAL}.{NODE_FEATURE_GROUP}")
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
                log.warning("start-up discovery failed (GET /version, the ServiceMonitor and NodeFeature CRDs, "
                            "OpenShift's ClusterVersion): %s; not starting the loops, retrying in %.0f s", err, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                continue
            log.info("Kubernetes %s; platform %s; ServiceMonitor CRD %s; NodeFeature CRD %s", info.k8s_version,
                     platform_name(info.openshift_version),
                     "present" if info.servicemonitor_crd else "absent",
                     "present" if info.node_feature_crd else "absent")
            return info
        return None


@dataclass
class ReadModel:
    namespace: str
    info: ClusterInfo = field(default_factory=ClusterInfo)
    # The Node reflector's views by name (the reflector's own dict, read in place).
    node_map: Mapping[str, NodeView] = field(default_factory=dict)
    # kopf's live indices by id, taken from its startup handler's kwargs (kopf's public way).
    indices: dict[str, Any] = field(default_factory=dict)
    owned_kinds: list[OwnedKind] = field(default_factory=lambda: list(OWNED_KINDS))

    # -- nodes -------------------------------------------------------------------------------------

    def nodes(self) -> list[NodeView]:
        return list(self.node_map.values())

    def node(self, name: str) -> NodeView | None:
        return self.node_map.get(name)

    # -- our CRs, one typed view per kind ------------------------------------------------------------

    def _views(self, index: str) -> list[Any]:
        return [v for store in self.indices[index].values() if (v := first(store)) is not None]

    def policies(self) -> list[ClusterPolicyView]:
        return self._views(POLICIES)

    def drivers(self) -> list[NVIDIADriverView]:
        return self._views(DRIVERS)

    def gpuclusters(self) -> list[GPUClusterView]:
        return self._views(GPUCLUSTERS)

    def active_policy(self) -> ClusterPolicyView | None:
        """The singleton rule (controllers/queries.py): the oldest ClusterPolicy."""
        return active_policy(self.policies())

    def active_model(self) -> ClusterPolicy | None:
        """The active ClusterPolicy's parsed spec; None if there is none or it is invalid."""
        active = self.active_policy()
        return active.parsed.model if active is not None else None

    def active_gpucluster(self) -> GPUClusterView | None:
        """The GPUCluster that runs the DRA stack: the singleton, valid, not being deleted, and no
        ClusterPolicy beside it (which stops both)."""
        if self.policies():
            return None
        view = next((v for v in self.gpuclusters() if v.name == SINGLETON), None)
        if view is None or view.parsed.model is None or view.body.get("metadata", {}).get("deletionTimestamp"):
            return None
        return view

    def health_spec(self) -> HealthSpec | None:
        """GPU health's settings for the active stack: a valid ClusterPolicy's spec.health (its
        defaults where unset), the defaults under a GPUCluster (it has no spec.health); None
        without either (a ClusterPolicy the model refuses included): then health changes nothing."""
        policy = self.active_policy()
        if policy is not None:
            model = policy.parsed.model
            return (model.spec.health or HealthSpec()) if model is not None else None
        return HealthSpec() if self.active_gpucluster() is not None else None

    def gpucluster_owner(self) -> dict[str, Any] | None:
        """An ownerReference to the active GPUCluster (what the DRA stack's health objects hang on)."""
        view = self.active_gpucluster()
        if view is None:
            return None
        return {"apiVersion": f"{GPUCLUSTER_GROUP}/{GPUCLUSTER_VERSION}", "kind": GPUCLUSTER_KIND,
                "name": view.name, "uid": view.uid}

    def valid_drivers(self) -> tuple[dict[str, NVIDIADriver], dict[str, str]]:
        """Valid NVIDIADrivers by name, and the invalid ones' errors naming the field."""
        return parse_drivers(self.drivers())

    def node_drivers(self) -> dict[str, NodeDriver]:
        """Per GPU node, its NVIDIADriver (owner, conflict, auto-upgrade, orphaned pod)."""
        valid, _ = self.valid_drivers()
        return node_drivers(valid.values(), self.nodes(), self.driver_pods())

    # -- pods and owned objects ------------------------------------------------------------------------

    def driver_pods(self) -> list[DriverPodView]:
        return self._views(DRIVER_PODS)

    def owned(self) -> dict[Any, OwnedView]:
        owned: dict[Any, OwnedView] = {}
        for kind in self.owned_kinds:
            for key, store in self.indices[owned_index(kind)].items():
                if (view := first(store)) is not None:
                    owned[key] = view
        return owned

    @property
    def watched_kinds(self) -> frozenset[str]:
        return frozenset(k.kind for k in self.owned_kinds)

    def gfd_labels(self, node: str) -> Mapping[str, str] | None:
        """The labels GFD's NodeFeature publishes for `node`; None where there is none (or the
        NodeFeature kind is not served, or the mirror is off)."""
        store = self.indices.get(GFD_FEATURES)
        if store is None or node not in store:
            return None
        labels: Mapping[str, str] | None = first(store[node])
        return labels


class ObjectReader(Protocol):
    """What reading an object takes: a Kube, or `ReadOnce` over one."""

    async def get_dict(self, api_version: str, kind: str, name: str,
                       namespace: str | None = None) -> dict[str, Any] | None: ...


class ReadOnce:
    """A Kube's get_dict for one reconcile, each object read at most once: the user's ConfigMaps it
    needs for keys, content and a hash (one may be named by more than one field) are GET once."""

    def __init__(self, kube: ObjectReader) -> None:
        self.kube = kube
        self.seen: dict[tuple[str, str, str, str | None], dict[str, Any] | None] = {}

    async def get_dict(self, api_version: str, kind: str, name: str,
                       namespace: str | None = None) -> dict[str, Any] | None:
        key = (api_version, kind, name, namespace)
        if key not in self.seen:
            self.seen[key] = await self.kube.get_dict(api_version, kind, name, namespace=namespace)
        return self.seen[key]


async def configmap_keys(kube: ObjectReader, policy: ClusterPolicy, namespace: str) -> dict[str, tuple[str, ...]]:
    """Keys of the user's ConfigMaps the driver mounts file by file (repo, certs, modules): the
    one read a reconcile makes besides the caches (user ConfigMaps are not watched). A missing
    ConfigMap is left out: rendering then names the field that refers to it."""
    driver = policy.spec.driver
    names = {ref for ref in (
        driver.repoConfig.configMapName if driver.repoConfig else None,
        driver.certConfig.name if driver.certConfig else None,
        driver.kernelModuleConfig.name if driver.kernelModuleConfig else None,
    ) if ref}
    keys: dict[str, tuple[str, ...]] = {}
    for name in sorted(names):
        found = await kube.get_dict("v1", "ConfigMap", name, namespace=namespace)
        if found is not None:
            keys[name] = tuple(sorted({*(found.get("data") or {}), *(found.get("binaryData") or {})}))
    return keys


async def plugin_config_hash(kube: ObjectReader, policy: ClusterPolicy, namespace: str) -> str:
    """The hash of the devicePlugin.config ConfigMap's content ("" where none is named or it is
    missing): read once per reconcile, a change of it is an event (kube/configwatch.py)."""
    config = policy.spec.devicePlugin.config
    if config is None or not config.name:
        return ""
    found = await kube.get_dict("v1", "ConfigMap", config.name, namespace=namespace)
    return content_hash(found) if found is not None else ""
