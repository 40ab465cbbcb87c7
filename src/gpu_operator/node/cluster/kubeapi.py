"""The node agents' thin Kubernetes layer (lightkube sync Client): node labels, events, validation pods."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from gpu_operator.node.doctor.vmchecks import Advertised
from gpu_operator.node.validate.base import PodOutcome
from gpu_operator.vocabulary import NODE_AGENT_FIELD_MANAGER

FIELD_MANAGER = NODE_AGENT_FIELD_MANAGER


def new_client() -> Any:
    """The node agents' client (in-cluster credentials or KUBECONFIG), our field manager."""
    from lightkube import Client

    return Client(field_manager=FIELD_MANAGER)


def patch_node(
    client: Any,
    node_name: str,
    *,
    labels: dict[str, str | None] | None = None,
    annotations: dict[str, str | None] | None = None,
) -> Any:
    """One merge patch of a Node's labels and annotations (None removes one); the patched Node."""
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    meta: dict[str, Any] = {}
    if labels is not None:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return client.patch(Node, node_name, {"metadata": meta}, patch_type=PatchType.MERGE)


class _Watch:
    """One object kept as a watch of it by name sees it (a daemon thread; the kubelet watches its
    own Node the same way), watched again after a failure."""

    def __init__(self, what: str, watch: Any, keep: Any, log: Any) -> None:
        import threading

        from gpu_operator.node.cluster import kubetypes

        kubetypes.prepare()  # lightkube's types built here, before a second thread decodes them
        self.what, self.watch, self.keep, self.log = what, watch, keep, log
        self.thread = threading.Thread(target=self._run, name=f"watch-{what}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        failures = 0
        while True:
            try:
                for kind, obj in self.watch():
                    self.keep(None if kind == "DELETED" else obj)
                    failures = 0
            except Exception as err:  # noqa: BLE001 - the apiserver may be away: watch again
                failures += 1
                if failures == 1:
                    self.log(f"watching {self.what} failed ({err}); watching again")
            time.sleep(min(0.5 * 2 ** min(failures, 5), 15.0))


class RequestWatch:
    """What the health agent sees of the operator's requests (node/health/requests.py `Seen`): its
    own Node's labels and annotations (one watch of that Node), and its node's entry in the
    operator's requests Secret (one watch of that Secret by name, in the operator's namespace: the
    agent's Role may get and watch only it). `current()` is the latest seen."""

    def __init__(self, node_name: str, namespace: str, client: Any = None, log: Any = None) -> None:
        from lightkube.resources.core_v1 import Node, Secret

        from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET

        self.node_name, self.namespace = node_name, namespace
        self.client = client if client is not None else new_client()
        log = log or (lambda _m: None)
        self.labels: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.request: str | None = None
        self.watches = [
            _Watch(
                f"Node {node_name}",
                lambda: self.client.watch(Node, fields={"metadata.name": node_name}),
                self._node,
                log,
            ),
            _Watch(
                f"Secret {namespace}/{HEALTH_REQUESTS_SECRET}",
                lambda: self.client.watch(
                    Secret, namespace=namespace, fields={"metadata.name": HEALTH_REQUESTS_SECRET}
                ),
                self._secret,
                log,
            ),
        ]

    def _node(self, node: Any) -> None:
        meta = node.metadata if node is not None else None
        self.labels = dict((meta.labels if meta else None) or {})
        self.annotations = dict((meta.annotations if meta else None) or {})

    def _secret(self, secret: Any) -> None:
        self.request = request_entry(secret, self.node_name)

    def current(self) -> Any:
        from gpu_operator.node.health.requests import Seen

        return Seen(self.labels, self.annotations, self.request)


def request_entry(secret: Any, node_name: str) -> str | None:
    """This node's entry (its JSON text) in the requests Secret (a lightkube Secret or None)."""
    import base64
    import binascii

    data = (secret.data if secret is not None else None) or {}
    raw = data.get(node_name)
    if raw is None:
        return None
    try:
        return base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return "(not base64 text)"


class KubeNodeView:
    """ValidatorNodeView (node/validate/base.py) over the API for one node; the agent's own pod (POD_NAME) gives owner and tolerations."""

    def __init__(
        self,
        node_name: str,
        namespace: str,
        pod_name: str = "",
        client: Any = None,
        component: str = "gpu-operator-node-probe",
    ) -> None:
        self.node_name = node_name
        self.namespace = namespace
        self.pod_name = pod_name
        self.client = client or new_client()
        self.component = component

    def _node(self) -> dict[str, Any]:
        from lightkube.resources.core_v1 import Node

        node: dict[str, Any] = self.client.get(Node, self.node_name).to_dict()
        return node

    def node_labels(self) -> dict[str, str]:
        return dict(self._node().get("metadata", {}).get("labels") or {})

    def node_allocatable(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self._node().get("status", {}).get("allocatable") or {}).items()}

    def node_annotations(self) -> dict[str, str]:
        return dict(self._node().get("metadata", {}).get("annotations") or {})

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        """The Node's labels and annotations (one GET)."""
        meta = self._node().get("metadata", {})
        return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})

    def node_resources(self) -> tuple[dict[str, str], dict[str, str]]:
        """The Node's capacity and allocatable (one GET)."""
        status = self._node().get("status", {})
        return (
            {k: str(v) for k, v in (status.get("capacity") or {}).items()},
            {k: str(v) for k, v in (status.get("allocatable") or {}).items()},
        )

    def kubevirt_advertised(self) -> list[Advertised]:
        """Per PCI ID that a KubeVirt CR permits: its resource name and this Node's allocatable count of it."""
        from lightkube.generic_resource import create_namespaced_resource

        kubevirt = create_namespaced_resource("kubevirt.io", "v1", "KubeVirt", "kubevirts")
        names: dict[str, str] = {}
        for cr in self.client.list(kubevirt, namespace="*"):
            config = (cr.to_dict().get("spec") or {}).get("configuration") or {}
            for device in (config.get("permittedHostDevices") or {}).get("pciHostDevices") or []:
                if device.get("pciVendorSelector") and device.get("resourceName"):
                    names[device["pciVendorSelector"].lower()] = device["resourceName"]
        capacity, allocatable = self.node_resources()
        return [
            Advertised(ids, resource, int(allocatable.get(resource) or capacity.get(resource) or 0))
            for ids, resource in sorted(names.items())
        ]

    def validator_pod_template(self) -> dict[str, Any]:
        """What the workload pods take from the validator pod: its tolerations and ServiceAccount
        (where the platform grants privileged pods, e.g. OpenShift's SCC), and as owner the
        ClusterPolicy that owns the validator's DaemonSet (as NVIDIA's validator does). Never the
        DaemonSet itself: its controller orphans pods it does not select, and owning them with
        blockOwnerDeletion would need daemonsets/finalizers where owner permission is enforced."""
        from lightkube.resources.apps_v1 import DaemonSet
        from lightkube.resources.core_v1 import Pod

        if not self.pod_name:
            return {}
        pod = self.client.get(Pod, self.pod_name, namespace=self.namespace).to_dict()
        owners: list[dict[str, Any]] = []
        for ref in pod.get("metadata", {}).get("ownerReferences") or []:
            if ref.get("kind") != "DaemonSet":
                continue
            ds = self.client.get(DaemonSet, ref["name"], namespace=self.namespace).to_dict()
            owners += [
                {
                    "apiVersion": o["apiVersion"],
                    "kind": o["kind"],
                    "name": o["name"],
                    "uid": o["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
                for o in ds.get("metadata", {}).get("ownerReferences") or []
                if o.get("kind") == "ClusterPolicy"
            ]
        spec = pod.get("spec", {})
        return {
            "ownerReferences": owners[:1],
            "tolerations": spec.get("tolerations") or [],
            "serviceAccountName": spec.get("serviceAccountName") or "",
        }

    def run_pod(self, manifest: dict[str, Any], timeout: float) -> PodOutcome:
        """Delete earlier pods of the same app on this node, create this one, wait for it to end."""
        from lightkube.resources.core_v1 import Pod

        app = manifest["metadata"]["labels"]["app"]
        namespace = manifest["metadata"]["namespace"]
        for old in self.client.list(
            Pod, namespace=namespace, labels={"app": app}, fields={"spec.nodeName": self.node_name}
        ):
            self.client.delete(Pod, old.metadata.name, namespace=namespace)
        created = self.client.create(Pod.from_dict(manifest))
        name = created.metadata.name
        deadline = time.monotonic() + timeout
        detail = ""
        while time.monotonic() < deadline:
            pod = self.client.get(Pod, name, namespace=namespace).to_dict()
            phase = pod.get("status", {}).get("phase", "Pending")
            detail = pod_detail(pod)
            if phase in ("Succeeded", "Failed"):
                return PodOutcome(phase == "Succeeded", phase, detail)
            time.sleep(2)
        return PodOutcome(False, "Timeout", f"pod {namespace}/{name} still not finished; {detail}")

    def publish(
        self,
        labels: dict[str, str | None],
        events: list[dict[str, str]],
        annotations: dict[str, str | None] | None = None,
    ) -> None:
        """One merge patch of labels (and annotations), then one Event per entry (the patch answers the Node's uid)."""
        from lightkube.resources.core_v1 import Event

        node = patch_node(self.client, self.node_name, labels=labels, annotations=annotations).to_dict()
        for event in events:
            body = node_event(node, event, self.component)
            self.client.create(Event.from_dict(body))


def pod_detail(pod: dict[str, Any]) -> str:
    """The most telling reason a pod gives for its state (waiting/terminated reasons, scheduling messages)."""
    status = pod.get("status", {})
    parts = []
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = cs.get("state", {})
        for key in ("waiting", "terminated"):
            info = state.get(key)
            if info and info.get("reason") not in (None, "Completed", "PodInitializing"):
                parts.append(f"{cs.get('name')}: {info.get('reason')} {info.get('message', '')}".strip())
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            parts.append(f"{cond.get('type')}: {cond.get('message')}")
    if status.get("reason"):
        parts.append(f"{status['reason']}: {status.get('message', '')}")
    return "; ".join(parts)


def node_event(
    node: dict[str, Any], event: dict[str, str], component: str = "gpu-operator-node-probe"
) -> dict[str, Any]:
    """A core/v1 Event about a Node. The apiserver accepts events about cluster-scoped objects only in
    `default` (or no namespace), so that is where they go whatever namespace the agent runs in."""
    meta = node.get("metadata", {})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'node')}.", "namespace": "default"},
        "involvedObject": {
            "kind": "Node",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "apiVersion": "v1",
        },
        "reason": event["reason"],
        "message": event["message"][:1024],
        "type": event["type"],
        "source": {"component": component, "host": meta.get("name")},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
