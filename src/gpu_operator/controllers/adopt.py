"""Taking over from another operator that owned its objects by the same CR (NVIDIA's operator:
its ClusterPolicy is kept across the switch, so its objects carry a controller reference to the
very uid we reconcile; docs/migrate.md).

What we render of the same kind and name is applied over them (server-side apply, forced). What we
do not render is left behind: ours carry our managed-by label and the apply contract
(controllers/apply.py) deletes them when no longer rendered, but the other operator's carry no
such label (NVIDIA's operator labels only its DaemonSets so), so our watches never see them. One
sweep per owner and process lists each owned kind once and deletes an object only when it is
provably that owner's and not ours: a controller reference to the owner's uid and no managed-by
label of ours, and not in the render. Never a driver DaemonSet that still has pods: deleting it
deletes its pods, and a driver pod that goes unloads the driver under the GPU jobs on its node (it
stays, logged; it goes with its owner, or by hand once its nodes are drained).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from gpu_operator.controllers.views import object_key
from gpu_operator.controllers.watchedkinds import OWNED_KINDS
from gpu_operator.kube.client import Kube, ObjectKey
from gpu_operator.vocabulary import COMPONENT, DRIVER_COMPONENT_VALUE, MANAGED_BY, MANAGED_BY_VALUE

log = logging.getLogger(__name__)


def left_behind(obj: dict[str, Any], owner_uid: str) -> bool:
    """Controlled by the owner and not labelled as ours."""
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(MANAGED_BY) == MANAGED_BY_VALUE:
        return False
    controllers = [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")]
    return controllers == [owner_uid]


def runs_driver_pods(kind: str, obj: dict[str, Any]) -> bool:
    """A DaemonSet of driver pods (component nvidia-driver) whose status does not say it has none."""
    if kind != "DaemonSet":
        return False
    template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    if (template.get("labels") or {}).get(COMPONENT) != DRIVER_COMPONENT_VALUE:
        return False
    status = obj.get("status") or {}
    counted = status.get("observedGeneration") is not None
    return not counted or bool(status.get("currentNumberScheduled") or status.get("numberMisscheduled"))


async def sweep(
    kube: Kube,
    owner_uid: str,
    namespaces: Collection[str],
    desired: Collection[Any],
    keep_kinds: Collection[str],
) -> list[str]:
    """Delete what the owner controls, we did not label and do not render; returns what went."""
    deleted: list[str] = []
    for kind in OWNED_KINDS:
        if kind.kind in keep_kinds:
            continue
        api_version = f"{kind.group}/{kind.version}" if kind.group else kind.version
        scopes: list[str | None] = list(namespaces) if kind.namespaced else [None]
        for namespace in scopes:
            for obj in await kube.list_dicts(api_version, kind.kind, namespace=namespace):
                meta = obj["metadata"]
                key = object_key(api_version, kind.kind, meta.get("namespace"), meta["name"])
                if key in desired or not left_behind(obj, owner_uid):
                    continue
                ref = ObjectKey(api_version, kind.kind, meta["name"], meta.get("namespace"))
                if runs_driver_pods(kind.kind, obj):
                    log.warning(
                        "kept %s: controlled by the same owner (%s), not ours, not rendered, but its "
                        "driver pods run (deleting it would unload the driver on their nodes)",
                        ref,
                        owner_uid,
                    )
                    continue
                if await kube.delete(ref):
                    log.info(
                        "deleted %s: controlled by the same owner (%s), not ours, not rendered",
                        ref,
                        owner_uid,
                    )
                    deleted.append(f"{ref} (left by the previous operator)")
    return deleted
