"""A recorded fake Kube for the GPU health unit: Nodes and pods in memory, every call recorded;
strategic merge of node conditions (by type), merge patches with the resourceVersion precondition,
evictions (a pod named in `pdb_blocks` is refused by that budget). `FakeDRA`: the DRA stack's
DeviceTaintRule and ResourceSlice calls (kube/devicetaints.py), in memory."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import httpx2
import pytest
from lightkube.core.exceptions import ApiError

from gpu_operator.controllers.units.health import dra as hd
from gpu_operator.controllers.views import NodeView
from gpu_operator.kube import devicetaints
from gpu_operator.kube.pages import Evicted
from gpu_operator.kube.resources import ObjectKey
from gpu_operator.vocabulary import MANAGED_BY, MANAGED_BY_VALUE


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class _SecretCreator:
    """The lightkube client's create, for the requests Secret."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube

    async def create(self, obj: Any) -> None:
        body = obj.to_dict()
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.kube.secrets:
            raise ApiError(status=_status(409))
        self.kube.calls.append(("create", "Secret", key[1]))
        self.kube.secrets[key] = body

    def request(self, node: str, namespace: str = "gpu-operator") -> dict[str, Any] | None:
        import base64

        from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET

        raw = ((self.kube.secrets.get((namespace, HEALTH_REQUESTS_SECRET)) or {}).get("data") or {}).get(node)
        return json.loads(base64.b64decode(raw)) if raw else None


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.calls: list[tuple[str, ...]] = []
        self.events: list[tuple[str, str, str, bool]] = []
        self.pdb_blocks: dict[str, str] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> body
        self.client = _SecretCreator(self)
        self._version = 0
        self.http = httpx2.AsyncClient(
            transport=httpx2.MockTransport(self._answer), base_url="https://apiserver"
        )

    # -- the cluster

    def add_node(
        self,
        name: str,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> None:
        self.nodes[name] = {
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
            "spec": {"taints": list(taints or [])},
            "status": {"conditions": []},
        }
        self._bump(name)

    def add_pod(
        self,
        name: str,
        node: str,
        *,
        gpu: bool = True,
        labels: dict[str, str] | None = None,
        namespace: str = "default",
        owner: str = "ReplicaSet",
    ) -> None:
        res = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
        self.pods.append(
            {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": dict(labels or {}),
                    "ownerReferences": [{"kind": owner, "name": "o", "uid": "u", "controller": True}],
                },
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": res}]},
                "status": {"phase": "Running"},
            }
        )

    def view(self, name: str) -> NodeView | None:
        body = self.nodes.get(name)
        return NodeView.of(body) if body is not None else None

    def views(self) -> list[NodeView]:
        return [NodeView.of(b) for b in self.nodes.values()]

    def _bump(self, name: str) -> None:
        self._version += 1
        self.nodes[name]["metadata"]["resourceVersion"] = str(self._version)

    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in ("patch-status", "patch", "event", "evict", "delete")]

    # -- what Kube offers

    def write(self, verb: str, kind: str) -> None:
        return None

    async def _answer(self, request: httpx2.Request) -> httpx2.Response:
        assert request.method == "PATCH" and request.url.path.endswith("/status"), request.url.path
        assert request.headers["content-type"] == "application/strategic-merge-patch+json"
        name = request.url.path.split("/")[-2]
        if name not in self.nodes:
            return httpx2.Response(404, json={})
        conditions = self.nodes[name]["status"]["conditions"]
        body = json.loads(request.content)
        # metadata merges through /status as the apiserver's Node status strategy lets it
        notes = self.nodes[name]["metadata"].setdefault("annotations", {})
        for key, value in ((body.get("metadata") or {}).get("annotations") or {}).items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        for cond in body["status"]["conditions"]:
            self.calls.append(
                ("patch-status", name, cond["type"], cond.get("$patch", cond.get("status", "")))
            )
            conditions[:] = [c for c in conditions if c["type"] != cond["type"]] + (
                [] if cond.get("$patch") == "delete" else [cond]
            )
        self._bump(name)
        return httpx2.Response(200, json=self.nodes[name])

    async def get_dict(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        self.calls.append(("get", name))
        body = self.nodes.get(name)
        return copy.deepcopy(body) if body is not None else None

    async def list_dicts(
        self, api_version: str, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        assert (api_version, kind) == ("v1", "Node")
        return [copy.deepcopy(b) for b in self.nodes.values()]

    async def merge_patch(
        self, api_version: str, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> None:
        self.calls.append(("patch", name, json.dumps(patch, sort_keys=True)))
        if kind == "Secret":
            secret = self.secrets.get((namespace or "", name))
            if secret is None:
                raise ApiError(status=_status(404))
            _merge(secret, patch)
            return
        body = self.nodes[name]
        version = (patch.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != body["metadata"]["resourceVersion"]:
            raise ApiError(status=_status(409))
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        _merge(body, patch)
        self._bump(name)

    async def node_event(
        self, node: str, reason: str, message: str, *, warning: bool = True, namespace: str = "default"
    ) -> None:
        self.calls.append(("event", node, reason))
        self.events.append((node, reason, message, warning))

    async def evict(self, namespace: str, name: str) -> Evicted:
        self.calls.append(("evict", f"{namespace}/{name}"))
        if name in self.pdb_blocks:
            return Evicted(f"{namespace}/{self.pdb_blocks[name]}")
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        return Evicted()

    async def delete(self, key: ObjectKey, *, orphan: bool = False, foreground: bool = False) -> bool:
        self.calls.append(("delete", f"{key.namespace}/{key.name}"))
        self.pods = [p for p in self.pods if p["metadata"]["name"] != key.name]
        return True

    async def list_pods(
        self,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        slim: bool = False,
    ) -> list[dict[str, Any]]:
        node = (fields or "").removeprefix("spec.nodeName=")
        out = [p for p in self.pods if p["spec"]["nodeName"] == node]
        if labels:
            out = [p for p in out if _selects(labels, p["metadata"]["labels"])]
        return copy.deepcopy(out)


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """A label selector's equality (`k=v`) and set (`k in (a,b)`) terms, as the apiserver reads them."""
    terms = re.findall(r"[^,(]+\([^)]*\)|[^,]+", selector)
    for term in (t.strip() for t in terms):
        if " in (" in term:
            key, values = term.split(" in (", 1)
            if labels.get(key.strip()) not in {v.strip() for v in values.rstrip(")").split(",")}:
                return False
        else:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


def _status(code: int) -> Any:
    from lightkube.models.meta_v1 import Status

    return Status(code=code, message="conflict", reason="Conflict")


def slice_of(node: str, *devices: tuple[str, str | None], driver: str = hd.DRIVER) -> dict[str, Any]:
    out = []
    for name, bus in devices:
        attributes: dict[str, Any] = {"type": {"string": "gpu"}}
        if bus is not None:
            attributes[hd.PCI_BUS_ID] = {"string": bus}
        out.append({"name": name, "attributes": attributes})
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": out}}


class FakeDRA:
    """The kube/devicetaints calls, in memory."""

    def __init__(self, version: str | None, slices: list[dict[str, Any]]) -> None:
        self.version, self.slices = version, slices
        self.rules: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        async def rule_version(_kube: Any) -> str | None:
            self.calls.append("discover")
            return self.version

        async def list_rules(_kube: Any, version: str, labels: str) -> list[dict[str, Any]]:
            assert labels == f"{MANAGED_BY}={MANAGED_BY_VALUE}" and version == self.version
            self.calls.append("list")
            return list(self.rules.values())

        async def create_rule(_kube: Any, version: str, body: dict[str, Any]) -> bool:
            assert version == self.version and body["apiVersion"] == f"resource.k8s.io/{version}"
            self.calls.append("create")
            if body["metadata"]["name"] in self.rules:
                return False
            self.rules[body["metadata"]["name"]] = body
            return True

        async def delete_rule(_kube: Any, version: str, name: str) -> bool:
            assert version == self.version
            self.calls.append("delete")
            return self.rules.pop(name, None) is not None

        async def node_slices(_kube: Any, node: str, driver: str) -> list[dict[str, Any]]:
            self.calls.append("slices")
            return [s for s in self.slices if s["spec"]["nodeName"] == node and s["spec"]["driver"] == driver]

        for name, fn in (
            ("rule_version", rule_version),
            ("list_rules", list_rules),
            ("create_rule", create_rule),
            ("delete_rule", delete_rule),
            ("node_slices", node_slices),
        ):
            monkeypatch.setattr(devicetaints, name, fn)
