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


class SelectorKube:
    """Refuses the first apply of the DaemonSet for its selector (the live one is another
    operator's at template generation 3); records what is applied after."""

    def __init__(self) -> None:
        self.live: dict[str, Any] | None = {
            **DS,
            "metadata": {
                "name": "gpu-feature-discovery",
                "namespace": "ns",
                "annotations": {"deprecated.daemonset.template.generation": "3"},
            },
        }
        self.applied: list[dict[str, Any]] = []

    async def apply(self, obj: dict[str, Any]) -> None:
        if self.live is not None:
            raise refusal(422, "spec.selector")
        self.applied.append(obj)

    async def get_dict(self, *_: Any) -> dict[str, Any] | None:
        return self.live

    async def delete(self, key: Any, **kwargs: Any) -> bool:
        assert kwargs == {"orphan": True}
        self.live = None
        return True

    async def list_dicts(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return []


def test_a_daemonset_created_again_for_its_selector_starts_past_the_deleted_ones_generation() -> None:
    """The pods the new DaemonSet adopts carry the deleted one's pod-template-generation label; at
    the same generation the DaemonSet controller would count them up to date and never roll them
    (NVIDIA's GFD and validator on the real node after a take-over)."""
    import asyncio

    from gpu_operator.controllers.apply import Applied, Applier, owner_reference
    from gpu_operator.controllers.views import ClusterPolicyView
    from gpu_operator.render import RenderResult, StateResult

    kube = SelectorKube()
    applier = Applier(kube)  # type: ignore[arg-type]
    owner = ClusterPolicyView("cluster-policy", "policy-uid", 1, "t", {})
    ours: dict[str, Any] = {
        **DS,
        "metadata": {"name": "gpu-feature-discovery", "namespace": "ns", "labels": {"app": "gfd"}},
        "spec": {"selector": {"matchLabels": {"app": "gfd"}}},
    }
    result = RenderResult([StateResult("gpu-feature-discovery", True, "", [ours])])

    def run() -> Applied:
        done = Applied()
        # DaemonSets are watched: what the watch shows of them is `owned` (here: none, as after the
        # delete, until the create is seen)
        watched = frozenset({"DaemonSet"})
        asyncio.run(applier.apply(result, owner, owner_reference(owner), {}, watched, done))
        return done

    assert run().deleted == ["DaemonSet ns/gpu-feature-discovery (selector changed; orphaning its pods)"]
    assert run().applied == ["DaemonSet ns/gpu-feature-discovery"]
    annotations = kube.applied[0]["metadata"]["annotations"]
    assert annotations["deprecated.daemonset.template.generation"] == "4"
    # Only the create carries it: the applied hash (what later passes compare) is the render's own.
    assert "deprecated.daemonset.template.generation" not in ours["metadata"].get("annotations", {})
    kube.live = None
    run()
    assert "deprecated.daemonset.template.generation" not in kube.applied[-1]["metadata"].get(
        "annotations", {}
    )
