"""`gpu-operator diff`: what the operator would create, change and delete on the live cluster for
the active ClusterPolicy, or for a proposed one, shown as `kubectl diff` shows it.

The desired objects come from the renderer with the facts the operator reads (the nodes, the
Kubernetes version, the optional CRDs, the user ConfigMaps a policy names, the operand images of
the operator's Deployment), stamped as the applier stamps them (controllers/apply.py). Each is
sent as the operator's server-side apply with `dryRun=All`: the apiserver merges, defaults and
validates it and stores nothing, and that answer is compared with the live object, so fields the
server fills are the same on both sides. What the server alone sets (managedFields,
resourceVersion, uid, creationTimestamp, generation, status) is left out of both. An object whose
hash annotation already matches is one the operator leaves alone, so it is not shown either. What
the policy owns (by uid) and no longer renders is shown as deleted, as the applier deletes it.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
import yaml

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.apply import owner_reference, with_ownership
from gpu_operator.controllers.discovery import ClusterInfo
from gpu_operator.controllers.queries import active_policy, validation_message
from gpu_operator.controllers.units.clusterpolicy.reconcile import policy_facts
from gpu_operator.controllers.views import ClusterPolicyView, NodeView, object_key
from gpu_operator.controllers.watchedkinds import OWNED_KINDS
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.render import RenderError, render
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import operator_env
from gpu_operator.vocabulary import HASH_ANNOTATION, MANAGED_SELECTOR

# metadata the apiserver sets, never the operator: left out of both sides
SERVER_METADATA = ("managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "selfLink")
# annotations the apiserver's DaemonSet strategy keeps (the template generation)
SERVER_ANNOTATIONS = ("deprecated.daemonset.template.generation",)
# the uid a proposed policy is given when no ClusterPolicy exists yet (its objects would be new)
NEW_POLICY_UID = "00000000-0000-0000-0000-000000000000"
CREATE, CHANGE, DELETE = "create", "change", "delete"


class DiffError(Exception):
    """Input the diff cannot work from (no policy, an invalid one, one the renderer refuses)."""


@dataclass(frozen=True)
class ObjectDiff:
    """One object the operator would write: `live` before, `merged` after (None: absent)."""

    key: ObjectKey
    action: str
    live: dict[str, Any] | None
    merged: dict[str, Any] | None

    @property
    def file_name(self) -> str:
        """kubectl diff's name for the object: group.version.Kind.namespace.name."""
        group_version = self.key.api_version.replace("/", ".")
        where = f"{self.key.namespace}." if self.key.namespace else ""
        return f"{group_version}.{self.key.kind}.{where}{self.key.name}"

    def text(self) -> str:
        before, after = f"LIVE/{self.file_name}", f"MERGED/{self.file_name}"
        lines = difflib.unified_diff(_yaml_lines(self.live), _yaml_lines(self.merged), before, after)
        return f"diff -u -N {before} {after}\n" + "".join(lines)


def _yaml_lines(obj: dict[str, Any] | None) -> list[str]:
    return [] if obj is None else yaml.safe_dump(obj, sort_keys=True, width=1000).splitlines(keepends=True)


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what the server alone sets: status and SERVER_METADATA, SERVER_ANNOTATIONS."""
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.get("metadata") or {}
    for name in SERVER_METADATA:
        meta.pop(name, None)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in SERVER_ANNOTATIONS}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    return out


async def operator_images(
    kube: Kube, namespace: str, deployment: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """The operand images the operator renders with: the chart's defaults, under this process's
    `*_IMAGE` variables (as `run` by hand), under the operator Deployment's own values."""
    images = operator_env(environ, defaults=CHART_DEFAULT_IMAGES)
    found = await kube.get_dict("apps/v1", "Deployment", deployment, namespace=namespace)
    for container in ((((found or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []:
        images.update(operator_env({e["name"]: e.get("value") or "" for e in container.get("env") or []}))
    return images


def _policy_view(proposed: dict[str, Any] | None, live: ClusterPolicyView | None) -> ClusterPolicyView:
    """The policy to render: the proposed body under the active policy's identity (it would
    replace that one's spec), or the active policy itself."""
    if proposed is None:
        if live is None:
            raise DiffError(
                "there is no ClusterPolicy on the cluster: give the proposed one with --policy FILE "
                "or --values FILE"
            )
        return live
    if proposed.get("kind") != "ClusterPolicy" or not isinstance(proposed.get("spec", {}), dict):
        raise DiffError(
            f"the proposed policy is a {proposed.get('kind')!r}, not a ClusterPolicy "
            "(apiVersion nvidia.com/v1, kind ClusterPolicy, spec): give a ClusterPolicy manifest"
        )
    body = copy.deepcopy(proposed)
    meta = body.setdefault("metadata", {})
    meta["name"] = live.name if live is not None else meta.get("name") or "cluster-policy"
    meta["uid"] = live.uid if live is not None else NEW_POLICY_UID
    meta.setdefault("creationTimestamp", "")
    return ClusterPolicyView.of(body)


async def plan(
    kube: Kube,
    proposed: dict[str, Any] | None,
    *,
    namespace: str,
    deployment: str,
    environ: Mapping[str, str],
) -> list[ObjectDiff]:
    """Every object the operator would create, change or delete for the policy, in that order."""
    policies = [
        ClusterPolicyView.of({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", **p})
        for p in await kube.list_items("nvidia.com", "v1", "clusterpolicies")
    ]
    view = _policy_view(proposed, active_policy(policies))
    try:
        policy = ClusterPolicy.model_validate(view.body)
    except pydantic.ValidationError as err:
        raise DiffError(
            validation_message(err, "the proposed ClusterPolicy" if proposed else "the ClusterPolicy")
        ) from err
    nodes = [NodeView.of(n) for n in await kube.list_items("", "v1", "nodes")]
    info = await ClusterInfo.read(kube)
    facts = await policy_facts(
        kube,
        policy,
        [n.facts for n in nodes],
        namespace=namespace,
        k8s_version=info.k8s_version,
        operator_env=await operator_images(kube, namespace, deployment, environ),
        openshift=info.openshift,
        openshift_version=info.openshift_version,
        servicemonitor_crd=info.servicemonitor_crd,
    )
    try:
        result = render(policy, facts)
    except RenderError as err:
        raise DiffError(str(err)) from err

    diffs: list[ObjectDiff] = []
    desired: set[tuple[str, str, str | None, str]] = set()
    for obj in result.objects():
        applied = with_ownership(obj, view, owner_reference(view))
        key = ObjectKey.of(applied)
        desired.add(object_key(key.api_version, key.kind, key.namespace, key.name))
        live = await kube.get_dict(key.api_version, key.kind, key.name, namespace=key.namespace)
        live_hash = (((live or {}).get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION)
        if live is not None and live_hash == applied["metadata"]["annotations"][HASH_ANNOTATION]:
            continue  # the applier skips an object whose hash matches
        merged = comparable(await kube.apply_dry_run(applied))
        before = comparable(live) if live is not None else None
        if before != merged:
            diffs.append(ObjectDiff(key, CHANGE if live is not None else CREATE, before, merged))

    for kind in OWNED_KINDS:
        for live in await kube.list_items(kind.group, kind.version, kind.plural, labels=MANAGED_SELECTOR):
            meta = live.get("metadata") or {}
            api_version = f"{kind.group}/{kind.version}" if kind.group else kind.version
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            if (
                view.uid not in owners
                or kind.kind in result.keep_kinds
                or object_key(api_version, kind.kind, meta.get("namespace"), meta["name"]) in desired
            ):
                continue
            body = {"apiVersion": api_version, "kind": kind.kind, **live}
            diffs.append(ObjectDiff(ObjectKey.of(body), DELETE, comparable(body), None))
    order = {CREATE: 0, CHANGE: 1, DELETE: 2}
    return sorted(diffs, key=lambda d: (order[d.action], d.key.kind, d.key.namespace or "", d.key.name))
