"""A DaemonSet whose live selector differs from ours (NVIDIA's GFD and validator carry
app.kubernetes.io/part-of in theirs): the apiserver refuses the apply with 422 and the cause's
field `spec.selector`. Only that refusal of a DaemonSet is taken as one; the take-over itself is
tests/integration/test_takeover.py."""

from __future__ import annotations

from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status, StatusCause, StatusDetails

from gpu_operator.controllers.apply import immutable_selector

DS = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "gpu-feature-discovery"}}


def refusal(code: int, field: str | None, kind: str = "DaemonSet") -> ApiError:
    causes = (
        [StatusCause(field=field, reason="FieldValueInvalid", message="field is immutable")]
        if field
        else None
    )
    return ApiError(
        status=Status(code=code, reason="Invalid", details=StatusDetails(kind=kind, causes=causes))
    )


def test_only_a_daemonsets_selector_refusal_counts() -> None:
    assert immutable_selector(refusal(422, "spec.selector"), DS)
    assert not immutable_selector(refusal(422, "spec.template.spec.containers[0].image"), DS)
    assert not immutable_selector(refusal(409, "spec.selector"), DS)
    assert not immutable_selector(refusal(422, None), DS)
    other: dict[str, Any] = {**DS, "kind": "Deployment"}
    assert not immutable_selector(refusal(422, "spec.selector"), other)


class ListingKube:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects, self.deleted = objects, []  # type: list[dict[str, Any]], list[str]

    async def list_dicts(
        self, api_version: str, kind: str, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind and o["metadata"].get("namespace") == namespace]

    async def delete(self, key: Any, **_: Any) -> bool:
        self.deleted.append(f"{key.kind}/{key.name}")
        return True


def role(
    name: str, uid: str | None, labels: dict[str, str] | None = None, controller: bool = True
) -> dict[str, Any]:
    refs = (
        [{"uid": uid, "controller": controller, "kind": "ClusterPolicy", "name": "cluster-policy"}]
        if uid
        else []
    )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": "ns", "ownerReferences": refs, "labels": labels or {}},
    }


def test_the_sweep_deletes_only_what_the_owner_controls_unlabelled_and_unrendered() -> None:
    import asyncio

    from gpu_operator.controllers import adopt
    from gpu_operator.controllers.views import object_key

    kube = ListingKube(
        [
            role("nvidia-driver", "policy-uid"),  # NVIDIA's, not rendered by us: deleted
            role("rendered", "policy-uid"),  # rendered by us: ours now
            role(
                "ours", "policy-uid", {"app.kubernetes.io/managed-by": "gpu-operator"}
            ),  # the apply contract's
            role("another-owner", "other-uid"),
            role("not-controller", "policy-uid", controller=False),
            role("users", None),
        ]
    )
    desired = {object_key("rbac.authorization.k8s.io/v1", "Role", "ns", "rendered")}
    gone = asyncio.run(adopt.sweep(kube, "policy-uid", {"ns"}, desired, keep_kinds=()))  # type: ignore[arg-type]
    assert kube.deleted == ["Role/nvidia-driver"]
    assert len(gone) == 1


def test_the_sweep_lists_each_kind_in_its_rows_scope() -> None:
    """Namespaced kinds per namespace, cluster-scoped ones once, cluster-wide (each row's
    `namespaced`, controllers/watchedkinds.py): a left-behind ClusterRole and Role both go."""
    import asyncio

    from gpu_operator.controllers import adopt

    cluster_role = {**role("nvidia-driver-cr", "policy-uid"), "kind": "ClusterRole"}
    cluster_role["metadata"] = {k: v for k, v in cluster_role["metadata"].items() if k != "namespace"}
    kube = ListingKube([cluster_role, role("nvidia-driver", "policy-uid")])
    asyncio.run(adopt.sweep(kube, "policy-uid", {"ns"}, set(), keep_kinds=()))  # type: ignore[arg-type]
    assert sorted(kube.deleted) == ["ClusterRole/nvidia-driver-cr", "Role/nvidia-driver"]
