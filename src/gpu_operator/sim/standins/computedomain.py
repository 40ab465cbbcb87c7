"""The compute-domain side of NVIDIA's DRA driver on kwok nodes (GB200 NVL72 and other shapes whose
GPUs share an NVLink fabric): what its controller, its kubelet plugin's `compute-domains` container
and the IMEX daemons it starts do to the API, each with its own pod's ServiceAccount and only while
that pod runs.

- The controller (`ComputeDomainController`, a node stand-in of the controller Deployment's pod,
  app=nvidia-dra-driver-controller): for each ComputeDomain, the workload's ResourceClaimTemplate
  (the name the domain's spec.channel gives, in its namespace: one request `channel` of class
  compute-domain-default-channel.nvidia.com, an opaque ComputeDomainChannelConfig with the domain's
  UID and allocation mode), the daemons' ResourceClaimTemplate and the IMEX DaemonSet
  `computedomain-daemon-<uid>` in the driver's namespace (its pods select nodes labelled
  `resource.nvidia.com/computeDomain=<uid>`, claim one `daemon` device, tolerate every taint, run as
  compute-domain-daemon-service-account); the domain's status: its nodes from the
  ComputeDomainCliques of its daemons (entries of nodes without a daemon pod dropped first), Ready
  once no node is NotReady and at least numNodes are there. A domain that is gone: its DaemonSet
  and templates deleted.
- The kubelet plugin (`ChannelPlugin`, its `compute-domains` container): sim/standins/computedomainplugin.py.
- The IMEX daemon (`Daemons`, driven by the controller stand-in's loop, each call with the daemon
  pod's own token): once its pod runs, it records itself (node, pod IP, clique ID, index, Ready) in
  the ComputeDomainClique `<uid>.<clique ID>` of the driver's namespace (labelled with the domain
  and the clique, owned by each of its daemon pods), and labels its pod `resource.nvidia.com/computeDomain.cliqueID`. The clique ID is the node's
  NVLink fabric as the plugin reads it from NVML (`<cluster UUID>.<clique ID>`, the shape's
  `fabric_ids`); a domain whose nodes span two cliques gets one ComputeDomainClique per clique and
  nodes of both cliques in its status, as NVIDIA's driver reports it (each clique its own IMEX
  domain: memory is shared only inside one).

Sources (NVIDIA/k8s-dra-driver-gpu at 22407113, read for facts only): cmd/compute-domain-controller
(computedomain.go: the label keys, device classes, target values, the global status;
daemonset.go, resourceclaimtemplate.go, cdstatus.go), templates/compute-domain-daemon.tmpl.yaml,
compute-domain-daemon-claim-template.tmpl.yaml, compute-domain-workload-claim-template.tmpl.yaml;
cmd/compute-domain-kubelet-plugin (driver.go: only channel 0 published; nvlib.go: the devices and
the clique ID; deviceinfo.go; computedomain.go: AddNodeLabel, RemoveNodeLabel,
AssertComputeDomainNamespace; device_state.go); cmd/compute-domain-daemon/cdclique.go (the clique's
name, label, next free index); api/nvidia.com/resource/v1beta1; pkg/featuregates (ComputeDomainCliques
and IMEXDaemonsWithDNSNames on by default).

Not played: finalizers, the workload pod held until its node's daemon is Ready (kwok runs it at once),
the daemons' DNS names and IMEX config, numNodes gating with IMEXDaemonsWithDNSNames off.
"""

from __future__ import annotations

import logging
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.operators import exists
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpu_operator.kube.resources import ComputeDomainCliqueResource, ComputeDomainResource
from gpu_operator.sim.standins import identity as ident
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView

log = logging.getLogger("gpu_operator.sim.standins.computedomain")

DRIVER = "compute-domain.nvidia.com"
CONTROLLER_APP = "nvidia-dra-driver-controller"
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
CLIQUE_LABEL = "resource.nvidia.com/computeDomain.cliqueID"
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
DAEMON_ACCOUNT = "compute-domain-daemon-service-account"
CONFIG_API = "resource.nvidia.com/v1beta1"
FIELD_MANAGER = "gpu-operator-sim-computedomain"
POLL = 1.0  # seconds between the controller's (and the plugin's) looks while their pod runs
ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
ResourceClaimTemplate = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"
)
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


def daemon_name(uid: str) -> str:
    """The IMEX DaemonSet's and its claim template's name."""
    return f"computedomain-daemon-{uid}"


def clique_id(view: StandinNodeView | None) -> str:
    """The node's clique as the plugin reads it from NVML: `<cluster UUID>.<clique ID>`; "" without
    a fabric (the daemons then run without IMEX)."""
    if view is None or view.shape is None or not view.nvidia_gpus:
        return ""
    ids = view.shape.fabric_ids(view.name)
    return ".".join(ids) if ids else ""


def _template(
    name: str,
    namespace: str,
    uid: str,
    target: str,
    request: str,
    device_class: str,
    parameters: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {DOMAIN_LABEL: uid, TARGET_LABEL: target},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {
                            "requests": [request],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {"apiVersion": CONFIG_API, **parameters},
                            },
                        }
                    ],
                }
            }
        },
    }


def workload_template(cd: dict[str, Any]) -> dict[str, Any]:
    meta, channel = cd["metadata"], cd["spec"]["channel"]
    return _template(
        channel["resourceClaimTemplate"]["name"],
        meta["namespace"],
        meta["uid"],
        "Workload",
        "channel",
        CHANNEL_CLASS,
        {
            "kind": "ComputeDomainChannelConfig",
            "domainID": meta["uid"],
            "allocationMode": channel.get("allocationMode") or "Single",
        },
    )


def daemon_template(uid: str, namespace: str) -> dict[str, Any]:
    return _template(
        daemon_name(uid),
        namespace,
        uid,
        "Daemon",
        "daemon",
        DAEMON_CLASS,
        {"kind": "ComputeDomainDaemonConfig", "domainID": uid},
    )


def daemonset(uid: str, namespace: str, image: str, verbosity: str) -> dict[str, Any]:
    labels = {DOMAIN_LABEL: uid}
    container = {
        "name": "compute-domain-daemon",
        "image": image,
        "command": ["compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "run"],
        "env": [
            {"name": "LOG_VERBOSITY", "value": verbosity},
            *(
                {"name": n, "valueFrom": {"fieldRef": {"fieldPath": p}}}
                for n, p in (
                    ("NODE_NAME", "spec.nodeName"),
                    ("POD_IP", "status.podIP"),
                    ("POD_UID", "metadata.uid"),
                    ("POD_NAME", "metadata.name"),
                    ("POD_NAMESPACE", "metadata.namespace"),
                )
            ),
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        ],
        "resources": {"claims": [{"name": "compute-domain-daemon"}]},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": daemon_name(uid), "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": DAEMON_ACCOUNT,
                    "nodeSelector": dict(labels),
                    "containers": [container],
                    "tolerations": [
                        {"operator": "Exists", "effect": e}
                        for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")
                    ],
                    "resourceClaims": [
                        {"name": "compute-domain-daemon", "resourceClaimTemplateName": daemon_name(uid)}
                    ],
                },
            },
        },
    }


def global_status(nodes: list[dict[str, Any]], num_nodes: int) -> str:
    """NotReady with fewer nodes than numNodes or any node NotReady, else Ready."""
    if len(nodes) < num_nodes or any(n.get("status") != "Ready" for n in nodes):
        return "NotReady"
    return "Ready"


def nodes_from_cliques(cliques: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        (
            {
                "name": d["nodeName"],
                "ipAddress": d.get("ipAddress", ""),
                "cliqueID": d.get("cliqueID", ""),
                "index": d.get("index", 0),
                "status": d.get("status", "NotReady"),
            }
            for c in cliques
            for d in c.get("daemons") or []
        ),
        key=lambda n: n["name"],
    )


def as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


async def create_if_absent(client: Any, body: dict[str, Any]) -> bool:
    """Create unless there (True: created)."""
    try:
        await client.create(from_dict(body))
    except ApiError as err:
        if err.status.code != 409:
            raise
        return False
    return True


async def _delete(client: Any, resource: Any, name: str, namespace: str) -> None:
    try:
        await client.delete(resource, name, namespace=namespace)
    except ApiError as err:
        if err.status.code != 404:
            raise


class Daemons:
    """The IMEX daemons: each running daemon pod records itself in its clique, with its own token."""

    def __init__(self) -> None:
        self.identities: Any = None
        self.nodes: dict[str, StandinNodeView | None] = {}

    async def _node(self, client: Any, name: str) -> StandinNodeView | None:
        if name not in self.nodes:
            try:
                self.nodes[name] = StandinNodeView.of(await client.get(Node, name))
            except ApiError as err:
                if err.status.code != 404:
                    raise
                return None
        return self.nodes[name]

    async def sync(self, client: Any, namespace: str) -> set[str]:
        """`client`: the controller's (to find the daemon pods); each daemon writes as itself.
        Returns the nodes with a daemon pod (the controller's view, for its clique cleanup)."""
        nodes: set[str] = set()
        async for pod in client.list(Pod, namespace=namespace, labels={DOMAIN_LABEL: exists()}):
            view = PodView.of(pod, label=DOMAIN_LABEL)
            if view.node:
                nodes.add(view.node)
            ip = str((pod.status.podIP if pod.status else None) or "")
            if not view.running or not view.node or self.identities is None:
                continue
            clique = clique_id(await self._node(client, view.node))
            try:  # each daemon is its own process: a refused call stops only its own write, retried
                await self._record(await self.identities.for_pod(view, FIELD_MANAGER), view, ip, clique)
            except ApiError as err:
                log.info(
                    "node %s: the IMEX daemon %s: %s (retried)", view.node, view.name, err.status.message
                )
        return nodes

    async def _record(self, daemon: Any, pod: PodView, ip: str, clique: str) -> None:
        uid, labels = pod.app, {}
        if clique:  # a daemon without fabric is reported from its pod by the controller (not played)
            name = f"{uid}.{clique}"
            try:
                found = as_dict(await daemon.get(ComputeDomainCliqueResource, name, namespace=pod.namespace))
            except ApiError as err:
                if err.status.code != 404:
                    raise
                found = {
                    "apiVersion": CONFIG_API,
                    "kind": "ComputeDomainClique",
                    "metadata": {
                        "name": name,
                        "namespace": pod.namespace,
                        "labels": {DOMAIN_LABEL: uid, CLIQUE_LABEL: clique},
                    },
                    "daemons": [],
                }
            daemons = list(found.get("daemons") or [])
            mine = next((d for d in daemons if d.get("nodeName") == pod.node), None)
            wanted = {
                "nodeName": pod.node,
                "ipAddress": ip,
                "cliqueID": clique,
                "status": "Ready",
                "index": mine["index"]
                if mine
                else min(set(range(len(daemons) + 1)) - {d.get("index") for d in daemons}),
            }
            owners = list(found["metadata"].get("ownerReferences") or [])
            if mine != wanted or all(o.get("uid") != pod.uid for o in owners):
                found["daemons"] = [*(d for d in daemons if d.get("nodeName") != pod.node), wanted]
                # every daemon pod owns its clique: the garbage collector takes it with the last one
                found["metadata"]["ownerReferences"] = [
                    *(o for o in owners if o.get("uid") != pod.uid),
                    {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid},
                ]
                if found["metadata"].get("resourceVersion"):
                    await daemon.replace(from_dict(found))
                else:
                    await daemon.create(from_dict(found))
                log.info(
                    "node %s: the IMEX daemon of ComputeDomain %s joined clique %s", pod.node, uid, clique
                )
        labels[CLIQUE_LABEL] = clique
        await daemon.patch(
            Pod,
            pod.name,
            {"metadata": {"labels": labels}},
            namespace=pod.namespace,
            patch_type=PatchType.MERGE,
        )


class ComputeDomainController:
    """NVIDIA's compute-domain controller while its pod runs (a `podwatch.Player`)."""

    app = CONTROLLER_APP
    field_manager = FIELD_MANAGER
    identity = ident.POD  # the controller pod's ServiceAccount; the daemons': each pod's own

    def __init__(self) -> None:
        self.identities: Any = None
        self.daemons = Daemons()

    async def start(self, client: AsyncClient) -> None:
        return None

    async def sync(
        self, client: Any, node: str, view: StandinNodeView | None, pods: list[PodView]
    ) -> float | None:
        running = sorted((p for p in pods if p.running), key=lambda p: (p.started, p.name))
        if not running:
            return None
        pod = running[-1]
        self.daemons.identities = self.identities
        try:
            try:  # one list of the domains a poll, for their objects and their status
                domains = [as_dict(cd) async for cd in client.list(ComputeDomainResource, namespace="*")]
            except ApiError as err:
                if err.status.code == 404:
                    return None  # the ComputeDomain CRD is not served: nothing to do, as NVIDIA's would wait
                raise
            await self.reconcile(
                client,
                pod.namespace,
                domains,
                pod.env.get("IMAGE_NAME", ""),
                pod.env.get("LOG_VERBOSITY_CD_DAEMON", "4"),
            )
            await self.statuses(
                client, pod.namespace, domains, await self.daemons.sync(client, pod.namespace)
            )
        except ApiError as err:
            log.info("the compute-domain controller: %s (retried)", err.status.message)
        return POLL

    async def reconcile(
        self, client: Any, namespace: str, domains: list[dict[str, Any]], image: str, verbosity: str
    ) -> None:
        live = {cd["metadata"]["uid"] for cd in domains if not cd["metadata"].get("deletionTimestamp")}
        for cd in domains:
            uid = cd["metadata"]["uid"]
            if uid not in live:
                continue
            for body in (
                workload_template(cd),
                daemon_template(uid, namespace),
                daemonset(uid, namespace, image, verbosity),
            ):
                if await create_if_absent(client, body):
                    log.info(
                        "ComputeDomain %s/%s: %s %s created",
                        cd["metadata"]["namespace"],
                        cd["metadata"]["name"],
                        body["kind"],
                        body["metadata"]["name"],
                    )
        async for ds in client.list(DaemonSet, namespace=namespace, labels={DOMAIN_LABEL: exists()}):
            if ds.metadata.labels[DOMAIN_LABEL] not in live:
                await _delete(client, DaemonSet, str(ds.metadata.name), namespace)
        async for rct in client.list(ResourceClaimTemplate, namespace="*", labels={DOMAIN_LABEL: exists()}):
            meta = rct.metadata
            if meta.labels[DOMAIN_LABEL] not in live:
                await _delete(client, ResourceClaimTemplate, str(meta.name), str(meta.namespace))

    async def statuses(
        self, client: Any, namespace: str, domains: list[dict[str, Any]], daemon_nodes: set[str]
    ) -> None:
        """Each domain's status from its cliques, once the cliques' entries of nodes without a daemon
        pod are dropped (NVIDIA's clique cleanup)."""
        cliques = [as_dict(c) async for c in client.list(ComputeDomainCliqueResource, namespace=namespace)]
        for clique in cliques:
            kept = [d for d in clique.get("daemons") or [] if d.get("nodeName") in daemon_nodes]
            if len(kept) != len(clique.get("daemons") or []):
                clique["daemons"] = kept
                await client.replace(from_dict(clique))
                log.info(
                    "ComputeDomainClique %s: entries of nodes without a daemon pod removed",
                    clique["metadata"]["name"],
                )
        for cd in domains:
            uid = cd["metadata"]["uid"]
            nodes = nodes_from_cliques(
                [c for c in cliques if (c["metadata"].get("labels") or {}).get(DOMAIN_LABEL) == uid]
            )
            status = {
                "status": global_status(nodes, int((cd.get("spec") or {}).get("numNodes") or 0)),
                "nodes": nodes,
            }
            if (cd.get("status") or {}) != status:
                cd["status"] = status
                await client.replace(ComputeDomainResource.Status.from_dict(cd))  # update, as NVIDIA's does
                log.info(
                    "ComputeDomain %s/%s: %s, nodes %s",
                    cd["metadata"]["namespace"],
                    cd["metadata"]["name"],
                    status["status"],
                    ", ".join(f"{n['name']} (clique {n['cliqueID']})" for n in nodes) or "none",
                )
