"""`gpu-operator must-gather`: one tarball a user can attach to a bug report.

Everything is read through the Kubernetes API with the caller's credentials (reads only) and
passed through `redact` before it is written. What could not be read (not served, forbidden,
a node the apiserver cannot reach for logs) is listed in `errors.txt`, never silently left out.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import tarfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml

from gpu_operator import __version__
from gpu_operator.admin import redact
from gpu_operator.controllers.customresources import CUSTOM_RESOURCES, CustomResource
from gpu_operator.controllers.watchedkinds import OWNED_KINDS, SERVICE_MONITOR, WatchedKind
from gpu_operator.kube.client import Kube
from gpu_operator.kube.pages import Answer
from gpu_operator.kube.reach import Unreachable
from gpu_operator.shapes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from gpu_operator.vocabulary import MANAGED_SELECTOR, PROBE_FACTS_ANNOTATION

OWNERS = CUSTOM_RESOURCES  # our CRs


class GatheredKind(NamedTuple):
    """A kind whose objects in the operator's namespace the bundle holds, all of them."""

    group: str
    version: str
    plural: str
    kind: str


IN_NAMESPACE = (
    GatheredKind("apps", "v1", "deployments", "Deployment"),
    GatheredKind("apps", "v1", "daemonsets", "DaemonSet"),
    GatheredKind("batch", "v1", "jobs", "Job"),
    GatheredKind("", "v1", "pods", "Pod"),
    GatheredKind("", "v1", "configmaps", "ConfigMap"),
    GatheredKind("coordination.k8s.io", "v1", "leases", "Lease"),
)
NODE_PREFIXES = (
    "nvidia.com/",
    "feature.node.kubernetes.io/pci-10de",
    "feature.node.kubernetes.io/kernel-version",
)
LOG_TAIL_LINES = 5000
LOG_TIMEOUT = 20.0  # seconds for one log: the apiserver dials the node's kubelet
LOG_NODES_AT_ONCE = 8
FAKE_NODE = "a fake (kwok) node: no kubelet behind it serves container logs"
SUMMARY_ITEMS = 8  # items named one by one in the summary; errors.txt has them all


@dataclass
class Bundle:
    """Files of the tarball (path under the top directory -> text) and what could not be read."""

    files: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    fake_nodes: set[str] = field(default_factory=set)  # kwok's nodes: no kubelet serves their logs
    fake_logs: list[str] = field(default_factory=list)  # errors: logs of pods on those nodes
    fake_log_nodes: set[str] = field(default_factory=set)  # the nodes of those pods
    unanswered: list[str] = field(default_factory=list)  # reads the apiserver gave no answer to, and why

    def summary(self) -> str:
        """What was collected and, item by item (grouped where one reason covers many), what not
        and why: the line `must-gather` prints."""
        head = f"{len(self.files)} file(s) collected"
        if not self.errors:
            return f"{head}; everything could be read"
        lines = [f"{head}; {len(self.errors)} item(s) could not be read (each in errors.txt):"]
        if self.fake_logs:
            lines.append(
                f"  {len(self.fake_logs)} container log(s) of pods on {len(self.fake_log_nodes)} fake (kwok) "
                "node(s), which serve no logs (expected on the simulator)"
            )
        fake = set(self.fake_logs)
        rest = [e for e in self.errors if e not in fake]
        lines += [f"  {e}" for e in rest[:SUMMARY_ITEMS]]
        if len(rest) > SUMMARY_ITEMS:
            lines.append(f"  ... and {len(rest) - SUMMARY_ITEMS} more")
        return "\n".join(lines)

    def yaml(self, path: str, data: Any) -> None:
        self.files[path] = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)

    def tarball(self, top: str) -> bytes:
        out = io.BytesIO()
        now = int(time.time())
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            errors = redact.text("\n".join(self.errors) + "\n")  # a URL or a message may quote a credential
            for path, content in sorted({**self.files, "errors.txt": errors}.items()):
                data = content.encode()
                info = tarfile.TarInfo(f"{top}/{path}")
                info.size, info.mtime, info.mode = len(data), now, 0o644
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()


class Gatherer:
    def __init__(self, kube: Kube, namespace: str, bundle: Bundle) -> None:
        self.kube, self.namespace, self.bundle = kube, namespace, bundle

    async def get(self, read: Callable[[dict[str, str]], Awaitable[Answer]], *, what: str) -> Any | None:
        """A read's JSON (every page of a list: `read` is called with the query of each page), or
        None with the reason recorded in errors.txt."""
        query: dict[str, str] = {}
        items: list[Any] = []
        while True:
            answer = await read(dict(query))
            if answer.status is None:
                self.bundle.errors.append(f"{what}: {answer.path}: {answer.error}")
                self.bundle.unanswered.append(answer.error)
                return None
            if answer.status != 200:
                self.bundle.errors.append(f"{what}: {answer.path}: HTTP {answer.status} {answer.reason}")
                return None
            body = answer.json()
            if not isinstance(body, dict) or "items" not in body:
                return body
            items.extend(body.get("items") or [])
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                return {**body, "items": items}
            query["continue"] = cont

    def listing(
        self, group: str, version: str, plural: str, namespace: str | None = None, **selectors: str
    ) -> Callable[[dict[str, str]], Awaitable[Answer]]:
        """The read of a kind's list for `get` (`selectors`: labelSelector, fieldSelector)."""
        return lambda query: self.kube.read_list(group, version, plural, namespace, {**selectors, **query})

    async def text(self, read: Awaitable[Answer]) -> tuple[str | None, int | None, str]:
        """A read's text, or None, the HTTP status (None: no answer) and why."""
        answer = await read
        if answer.status is None:
            return None, None, answer.error
        if answer.status != 200:
            return None, answer.status, f"HTTP {answer.status} {answer.reason}"
        return answer.text, 200, ""

    async def objects(
        self,
        kind: GatheredKind | WatchedKind | CustomResource[Any],
        dest: str,
        *,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> list[dict[str, Any]]:
        selectors = {"labelSelector": selector} if selector else {}
        body = await self.get(
            self.listing(kind.group, kind.version, kind.plural, namespace, **selectors), what=kind.kind
        )
        items = [
            {"apiVersion": f"{kind.group}/{kind.version}".lstrip("/"), "kind": kind.kind, **i}
            for i in (body or {}).get("items", [])
        ]
        if body is not None:
            self.bundle.yaml(dest, [redact.obj(i) for i in items])
        return items

    async def versions(self) -> None:
        server = await self.get(lambda _: self.kube.read_version(), what="apiserver version")
        if server is None and self.bundle.unanswered:  # the first read: an apiserver that does not answer
            raise Unreachable(self.bundle.unanswered[0])
        server = server or {}
        crds = (
            await self.get(
                self.listing("apiextensions.k8s.io", "v1", "customresourcedefinitions"), what="CRDs"
            )
            or {}
        )
        ours = {
            c["metadata"]["name"]: [v["name"] for v in c["spec"]["versions"] if v.get("served")]
            for c in crds.get("items", [])
            if c["spec"]["group"] == "nvidia.com"
        }
        self.bundle.files["versions.json"] = (
            json.dumps(
                {"mustGather": __version__, "kubernetes": server.get("gitVersion"), "crds": ours}, indent=2
            )
            + "\n"
        )

    async def nodes(self) -> None:
        body = await self.get(self.listing("", "v1", "nodes"), what="nodes")
        if body is None:
            return
        out = []
        for node in body["items"]:
            meta, status = node["metadata"], node.get("status") or {}
            if (meta.get("annotations") or {}).get(KWOK_ANNOTATION) == KWOK_ANNOTATION_VALUE:
                self.bundle.fake_nodes.add(meta["name"])
            mine = redact.mapping(
                {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(NODE_PREFIXES)}
            )
            notes = redact.mapping(
                {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("nvidia.com/")}
            )
            info = status.get("nodeInfo") or {}
            out.append(
                {
                    "name": meta["name"],
                    "labels": mine,
                    "annotations": notes,
                    "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
                    "conditions": {c["type"]: c["status"] for c in status.get("conditions") or []},
                    "capacity": {k: v for k, v in (status.get("capacity") or {}).items() if "/" in k},
                    "allocatable": {k: v for k, v in (status.get("allocatable") or {}).items() if "/" in k},
                    "nodeInfo": {
                        k: info.get(k)
                        for k in (
                            "kernelVersion",
                            "osImage",
                            "containerRuntimeVersion",
                            "kubeletVersion",
                            "architecture",
                        )
                    },
                }
            )
            if facts := notes.get(PROBE_FACTS_ANNOTATION):
                self.bundle.files[f"nodes/{meta['name']}/probe-facts.json"] = _pretty(facts)
        self.bundle.yaml("nodes.yaml", out)
        await self.node_findings({n["name"] for n in out if n["labels"] or n["annotations"]})

    async def node_findings(self, names: set[str]) -> None:
        """What each GPU node's probe reported (its Events: the findings `doctor` prints on that
        host, with evidence and fix), newest last."""
        body = await self.get(
            self.listing("", "v1", "events", fieldSelector="involvedObject.kind=Node"), what="node events"
        )
        by_node: dict[str, list[str]] = {}
        for event in sorted((body or {}).get("items", []), key=_when):
            node = (event.get("involvedObject") or {}).get("name")
            if node in names:
                source = (event.get("source") or {}).get("component", "")
                by_node.setdefault(node, []).append(
                    redact.text(
                        f"{_when(event)} {event.get('type')} {event.get('reason')} ({source}) "
                        f"x{event.get('count', 1)}: {event.get('message', '')}"
                    )
                )
        for node, lines in by_node.items():
            self.bundle.files[f"nodes/{node}/events.txt"] = "\n".join(lines) + "\n"

    async def events(self) -> None:
        body = await self.get(self.listing("", "v1", "events", self.namespace), what="events")
        if body is not None:
            items = sorted(body["items"], key=_when)
            self.bundle.yaml(f"namespaces/{self.namespace}/events.yaml", [redact.obj(e) for e in items])

    async def secrets(self) -> None:
        body = await self.get(self.listing("", "v1", "secrets", self.namespace), what="secrets")
        if body is not None:
            self.bundle.yaml(
                f"namespaces/{self.namespace}/secrets.yaml", [redact.secret(s) for s in body["items"]]
            )

    async def logs(self, pods: Iterable[dict[str, Any]]) -> None:
        """Every container's log (init containers too), and the previous one of any that
        restarted; nodes in parallel. The apiserver fetches logs from the node's kubelet: once a
        node answers 5xx (the apiserver cannot reach it), its other logs are listed, not tried."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_node.setdefault((pod.get("spec") or {}).get("nodeName") or "", []).append(pod)
        limit = asyncio.Semaphore(LOG_NODES_AT_ONCE)

        async def one_node(node: str, pods: list[dict[str, Any]]) -> None:
            def failed(line: str) -> None:
                if node in self.bundle.fake_nodes:
                    line += f" (node {node} is {FAKE_NODE})"
                    self.bundle.fake_logs.append(line)
                    self.bundle.fake_log_nodes.add(node)
                self.bundle.errors.append(line)

            async with limit:
                unreachable = ""
                for pod, container, previous in _log_requests(pods):
                    meta = pod["metadata"]
                    where = f"logs of {meta['name']}/{container}{' (previous)' if previous else ''}"
                    if unreachable or not node:
                        failed(
                            f"{where}: not tried: "
                            + (
                                f"node {node} unreachable for logs ({unreachable})"
                                if node
                                else "pod not scheduled"
                            )
                        )
                        continue
                    log, failure, why = await self.text(
                        self.kube.read_pod_log(
                            meta["namespace"],
                            meta["name"],
                            container,
                            tail_lines=LOG_TAIL_LINES,
                            previous=previous,
                            timeout=LOG_TIMEOUT,
                        )
                    )
                    if log is not None:
                        suffix = ".previous.log" if previous else ".log"
                        self.bundle.files[f"logs/{meta['name']}/{container}{suffix}"] = redact.text(log)
                        continue
                    failed(f"{where}: {why}")
                    if failure is not None and failure >= 500:
                        unreachable = f"HTTP {failure} on {meta['name']}/{container}"

        await asyncio.gather(*(one_node(node, group) for node, group in sorted(by_node.items())))

    async def run(self) -> None:
        await self.versions()
        for owner in OWNERS:
            await self.objects(owner, f"cluster/{owner.kind}.yaml")
        for owned in (*OWNED_KINDS, SERVICE_MONITOR):
            await self.objects(owned, f"owned/{owned.kind}.yaml", selector=MANAGED_SELECTOR)
        pods: list[dict[str, Any]] = []
        for kind in IN_NAMESPACE:
            found = await self.objects(
                kind, f"namespaces/{self.namespace}/{kind.kind}.yaml", namespace=self.namespace
            )
            pods = found if kind.kind == "Pod" else pods
        await self.secrets()
        await self.events()
        await self.nodes()
        await self.logs(pods)


async def gather(kube: Kube, namespace: str) -> Bundle:
    bundle = Bundle()
    await Gatherer(kube, namespace, bundle).run()
    bundle.files["README.txt"] = README.format(namespace=namespace, when=dt.datetime.now(dt.UTC).isoformat())
    return bundle


def _log_requests(pods: list[dict[str, Any]]) -> Iterable[tuple[dict[str, Any], str, bool]]:
    """(pod, container, previous) for every container of the pods, previous runs of restarted ones."""
    for pod in pods:
        status = pod.get("status") or {}
        for state in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            yield pod, state["name"], False
            if state.get("restartCount"):
                yield pod, state["name"], True


def _when(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def _pretty(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), indent=2) + "\n"
    except ValueError:
        return raw


README = """gpu-operator must-gather, collected {when} (operator namespace {namespace}).

versions.json                 this tool's version, the apiserver's, our CRDs' served versions
cluster/                      ClusterPolicy, NVIDIADriver, GPUCluster objects with their status
owned/                        every object labelled app.kubernetes.io/managed-by=gpu-operator, by kind
namespaces/{namespace}/   Deployments, DaemonSets, Jobs, Pods (with status), ConfigMaps, Leases,
                              Secrets (names, types and key names only), Events
nodes.yaml                    every node: our labels and annotations, conditions, extended resources
nodes/NODE/                   probe facts the node published, and the Events about it (the probe's
                              findings with evidence and fix, upgrade and validation events)
logs/POD/CONTAINER.log        each container's last {lines} lines (.previous.log: before its restart)
errors.txt                    everything that could not be read, and why

Redacted: Secret values (never read into the bundle); environment variables, ConfigMap keys,
annotations, labels and fields named like credentials; the value after a --token/--password
argument; and in any text URL passwords, Authorization values, tokens, Docker config auth fields,
netrc passwords, AWS access keys and private keys.
""".replace("{lines}", str(LOG_TAIL_LINES))
