"""OpenShift at run time, on the real control plane: the operator, started with no flag, detects
OpenShift as NVIDIA's operator does (the ClusterVersion `version`, config.openshift.io/v1) and
renders what `gpu-operator render --openshift` renders (an SCC per operand, the `use` rule in its
Role, the driver's OPENSHIFT_VERSION); without OpenShift's API groups it renders none of it.
OpenShift's two kinds come from small CRDs of ours (the operator needs the kinds to exist, not
OpenShift's full schemas), removed after the test with every object of theirs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from httpx2 import HTTPStatusError
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import Role

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.kube.resources import ClusterVersionResource, SecurityContextConstraintsResource
from gpu_operator.render import ClusterFacts, render
from gpu_operator.render.defaults import CHART_DEFAULT_IMAGES
from gpu_operator.render.facts import operator_env
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.waiting import wait_for

SCC_GROUP = "security.openshift.io"
DRIVER = "nvidia-driver"


def _crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


OPENSHIFT_CRDS = [
    _crd("config.openshift.io", "ClusterVersion", "clusterversions"),
    _crd(SCC_GROUP, "SecurityContextConstraints", "securitycontextconstraints"),
]


def _crd_gone(kube: Client, name: str) -> bool:
    try:
        kube.get(CustomResourceDefinition, name)
    except ApiError as err:
        return err.status.code == 404
    return False


@contextmanager
def openshift_apis(kube: Client) -> Iterator[None]:
    """OpenShift's ClusterVersion and SCC kinds, and a ClusterVersion whose last completed update is
    4.17.3; afterwards the CRDs (so every object of theirs) are deleted."""
    for crd in OPENSHIFT_CRDS:
        kube.apply(CustomResourceDefinition.from_dict(crd), field_manager="test")  # type: ignore[call-overload]
    try:

        def served() -> bool:
            try:
                list(kube.list(SecurityContextConstraintsResource))
                kube.create(
                    ClusterVersionResource.from_dict(
                        {
                            "apiVersion": "config.openshift.io/v1",
                            "kind": "ClusterVersion",
                            "metadata": {"name": "version"},
                            "status": {
                                "history": [
                                    {"state": "Partial", "version": "4.18.0"},
                                    {"state": "Completed", "version": "4.17.3"},
                                ]
                            },
                        }
                    )
                )
            except (
                HTTPStatusError
            ) as err:  # lightkube's ApiError is one; an unserved group answers plain text
                if err.response.status_code in (404, 429):  # until the new kinds are served
                    return False
                if err.response.status_code != 409:
                    raise
            return True

        wait_for("OpenShift's kinds served and the ClusterVersion `version` created", served, timeout=60)
        yield
    finally:
        for crd in OPENSHIFT_CRDS:
            kube.delete(CustomResourceDefinition, crd["metadata"]["name"])
        for crd in OPENSHIFT_CRDS:
            name = crd["metadata"]["name"]
            wait_for(f"CRD {name} removed", functools.partial(_crd_gone, kube, name), timeout=60)


def _driver_env(kube: Client, namespace: str) -> dict[str, str] | None:
    try:
        ds = kube.get(DaemonSet, "nvidia-driver-daemonset", namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise
    main = next(c for c in ds.spec.template.spec.containers if c.name == "nvidia-driver-ctr")
    return {e.name: str(e.value) for e in main.env or []}


def _scc_rule(kube: Client, namespace: str) -> bool:
    """Whether the driver's Role lets its ServiceAccount use an SCC (off OpenShift the driver has
    no Role at all: it reads nothing through the API, as NVIDIA's driver Role grants only the SCC)."""
    try:
        rules = kube.get(Role, DRIVER, namespace=namespace).rules or []
    except ApiError as err:
        if err.status.code == 404:
            return False
        raise
    return any(SCC_GROUP in (r.apiGroups or []) for r in rules)


def _sccs(kube: Client) -> dict[str, list[str]]:
    sccs: list[Any] = list(kube.list(SecurityContextConstraintsResource))
    return {s.metadata.name: s["users"] for s in sccs}


def _rendered_sccs(kube: Client, namespace: str, policy: dict[str, Any]) -> dict[str, list[str]]:
    """What `render --openshift` gives for the cluster's Nodes as they are now."""
    facts = ClusterFacts.from_nodes(
        [n.to_dict() for n in kube.list(Node)],
        namespace=namespace,
        openshift=True,
        operator_env=operator_env({}, CHART_DEFAULT_IMAGES),
    )
    result = render(ClusterPolicy.model_validate(policy), facts)
    return {
        o["metadata"]["name"]: o["users"]
        for s in result.states
        for o in s.objects
        if o["kind"] == "SecurityContextConstraints"
    }


def test_the_operator_detects_openshift_and_renders_for_it(
    kube: Client,
    fake_nodes: Callable[..., list[str]],
    start_operator: Callable[..., OperatorProcess],
    cluster_policies: Callable[..., str],
    operator_namespace: str,
) -> None:
    fake_nodes("dgx-h100:1")
    cluster_policies({})
    plain = start_operator()
    # Plain Kubernetes: the driver DaemonSet comes (after its Role: RBAC is applied first), no SCC
    # rule, no OpenShift version.
    env = wait_for(
        "the driver DaemonSet", lambda: _driver_env(kube, operator_namespace), context=plain.log_text
    )
    assert env is not None and "OPENSHIFT_VERSION" not in env
    assert not _scc_rule(kube, operator_namespace)
    plain.stop()

    with openshift_apis(kube):
        operator = start_operator()  # the same command line: nothing tells it the platform
        policy = {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
            "spec": {},
        }
        wait_for(
            "the SCCs `render --openshift` gives",
            lambda: _sccs(kube),
            until=lambda got: got and got == _rendered_sccs(kube, operator_namespace, policy),
            context=lambda: (operator.log_text()[-3000:], _rendered_sccs(kube, operator_namespace, policy)),
        )
        assert _sccs(kube)[DRIVER] == [f"system:serviceaccount:{operator_namespace}:{DRIVER}"]
        assert _scc_rule(kube, operator_namespace)
        wait_for(
            "the driver's OPENSHIFT_VERSION",
            lambda: (_driver_env(kube, operator_namespace) or {}).get("OPENSHIFT_VERSION"),
            until=lambda v: v == "4.17",
            context=operator.log_text,
        )
