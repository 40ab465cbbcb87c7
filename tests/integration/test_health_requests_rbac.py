"""Who can write GPU remediation's requests, asked of the real apiserver's RBAC authorizer.

The requests that make a node agent reset GPUs or create the reboot sentinel are the entries of one
Secret in the operator's namespace (vocabulary.HEALTH_REQUESTS_SECRET). Every ServiceAccount the
chart creates (`helm template`, hooks included) and every one the operator creates for its operands
(its render of the chart's default ClusterPolicy, with their Roles and ClusterRoles as the operator
applies them) is bound as rendered; then a SubjectAccessReview per account and verb asks whether it
may create, update, patch or delete that Secret. Only the operator's may; the validator's (the
health agent's) may get and watch it, and nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.core_v1 import Namespace

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.render import ClusterFacts, render
from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET
from tests.support.chart import find, objects, render_chart
from tests.support.cleanup import delete_if_present
from tests.unit.render.renderkit import IMAGES, K8S, nodes

NAMESPACE = "gpu-operator-requests"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
WRITES = ("create", "update", "patch", "delete")
OPERATOR = "gpu-operator"
VALIDATOR = "nvidia-operator-validator"
CLEANUP = "gpu-operator-cleanup"  # the chart's pre-delete hook


def rbac_objects() -> list[dict[str, Any]]:
    """The chart's RBAC objects and those of every operand the operator renders for the chart's
    default ClusterPolicy on GPU nodes of several kinds."""
    chart = objects(render_chart(None, namespace=NAMESPACE))
    default = find(chart, "ClusterPolicy", "cluster-policy")
    # and with VM workloads on: the sandbox operands' accounts too (vfio manager, vGPU managers, ...)
    sandbox = {**default, "spec": {**default["spec"], "sandboxWorkloads": {"enabled": True}}}
    facts = ClusterFacts.from_nodes(
        nodes("dgx-h100:2", "a10:1", "vgpu-host-h100:1", "vfio-passthrough:1"),
        namespace=NAMESPACE,
        k8s_version=K8S,
        operator_env=IMAGES,
    )
    rendered = [
        m
        for body in (default, sandbox)
        for state in render(ClusterPolicy.model_validate(body), facts).states
        for m in state.objects
    ]
    out = [o for o in [*chart, *rendered] if o.get("kind") in RBAC_KINDS]
    for obj in out:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"]["namespace"] = NAMESPACE
    return out


@pytest.fixture(scope="module")
def accounts(kube: Client) -> Iterator[list[str]]:
    """Every ServiceAccount, its roles bound as rendered (applied by an admin, as Helm and the
    operator would)."""
    kube.apply(
        from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}), force=True
    )
    objs = rbac_objects()
    for obj in objs:
        kube.apply(from_dict(obj), force=True)
    try:
        yield sorted({o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"})
    finally:
        for obj in objs:
            if obj["kind"].startswith("Cluster"):
                delete_if_present(kube, type(from_dict(obj)), obj["metadata"]["name"])
        kube.delete(Namespace, NAMESPACE)


def may(kube: Client, account: str, verb: str, name: str | None = HEALTH_REQUESTS_SECRET) -> bool:
    review = SubjectAccessReview(
        spec=SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            resourceAttributes=ResourceAttributes(
                group="", resource="secrets", verb=verb, name=name, namespace=NAMESPACE
            ),
        )
    )
    answer = kube.create(review)
    return bool(answer.status and answer.status.allowed)


def test_only_the_operator_may_write_the_requests(kube: Client, accounts: list[str]) -> None:
    # the chart's own accounts and the operands' (the validator, the device plugin, the MIG manager, ...)
    assert {OPERATOR, VALIDATOR, "nvidia-device-plugin", "nvidia-mig-manager", "nvidia-driver"} <= set(
        accounts
    )
    writers = {(account, verb) for account in accounts for verb in WRITES if may(kube, account, verb)}
    # The uninstall hook's account (it lives only while `helm uninstall` runs) may delete the Secret
    # the operator made, which withdraws every request and can ask for none; nobody else may.
    assert writers == {(OPERATOR, verb) for verb in WRITES} | {(CLEANUP, "delete")}
    # creating cannot be limited by name: no one else may create a Secret in the namespace at all
    assert [a for a in accounts if a != OPERATOR and may(kube, a, "create", None)] == []


def test_the_validator_may_only_read_the_requests_by_name(kube: Client, accounts: list[str]) -> None:
    assert [v for v in ("get", "list", "watch") if may(kube, VALIDATOR, v)] == ["get", "list", "watch"]
    assert not may(kube, VALIDATOR, "get", "some-other-secret")
    assert not may(kube, VALIDATOR, "list", None)  # not every Secret of the namespace
