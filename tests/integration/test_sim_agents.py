"""The simulator plays our GPU probe and vfio manager on kwok nodes (sim/standins/probestandin.py) only where
their pods run: a node with the probe's pod gets what the probe publishes for its shape's host
tree, with the node agents' field manager; a node without it gets nothing of the probe."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from lightkube import Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from gpu_operator.render.states import vfio_manager
from gpu_operator.sim.plane.controlplane import ControlPlane
from gpu_operator.sim.realnode.realspec import HOST_DRIVER_VERSION
from gpu_operator.sim.standins import roster
from gpu_operator.sim.standins.probestandin import PROBE_APP, VFIO_APP
from gpu_operator.vocabulary import (
    DRIVER_SOURCE,
    DRIVER_VERSION,
    NODE_AGENT_FIELD_MANAGER,
    PROBE_FACTS_ANNOTATION,
    PROBE_STATUS,
    VFIO_RESULT_ANNOTATION,
    VFIO_STATE,
)
from tests.integration.test_sim_standins import component_pod
from tests.support.audit import FORBIDDEN, status_code
from tests.support.cleanup import delete_if_present
from tests.support.waiting import wait_for

Nodes = Callable[..., list[str]]


def node_annotations(kube: Client, node: str) -> dict[str, str]:
    meta = kube.get(Node, node).metadata
    return dict((meta.annotations if meta else None) or {})


def node_labels(kube: Client, node: str) -> dict[str, str]:
    meta = kube.get(Node, node).metadata
    return dict((meta.labels if meta else None) or {})


def test_the_probe_and_vfio_manager_publish_only_where_their_pods_run(
    kube: Client, control_plane: ControlPlane, fake_nodes: Nodes, namespace: str, tmp_path: Path
) -> None:
    first, second = fake_nodes("vfio-passthrough:2")
    (host,) = fake_nodes("host-driver:1")
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    with roster.running(config, nodes=False, hosts=tmp_path / "hosts", agents=True) as agents:
        for name, node, app, argv in (
            ("probe-a", first, PROBE_APP, ["--default-workload=vm-passthrough"]),
            ("vfio-a", first, VFIO_APP, []),
            ("probe-h", host, PROBE_APP, ["--default-workload=container"]),
        ):
            pod = component_pod(name, namespace, node, app)
            assert pod.spec is not None
            pod.spec.containers[0].args = argv
            kube.create(pod)
        facts = json.loads(
            wait_for(
                f"the probe's facts on {first}",
                lambda: node_annotations(kube, first).get(PROBE_FACTS_ANNOTATION, ""),
                timeout=60,
            )
        )
        assert facts["driverSource"] == "vfio", facts
        assert facts["gpus"] and {g["driver"] for g in facts["gpus"]} == {"vfio-pci"}, facts
        assert all(g["vendorDevice"].startswith("10de:") for g in facts["gpus"]), facts
        got = kube.get(Node, first)
        assert got.metadata is not None
        assert (got.metadata.labels or {})[PROBE_STATUS] in ("ok", "warning", "error")
        # written as the probe writes: the node agents' field manager owns the annotation
        managers = {
            m.manager
            for m in got.metadata.managedFields or []
            if f"f:{PROBE_FACTS_ANNOTATION}" in json.dumps(m.fieldsV1)
        }
        assert managers == {NODE_AGENT_FIELD_MANAGER}, managers
        # the vfio manager's pass over the same tree: every GPU already on vfio-pci
        wait_for(
            f"the vfio manager's outcome on {first}",
            lambda: node_labels(kube, first).get(VFIO_STATE),
            until=lambda s: s == "bound",
            timeout=60,
        )
        record = json.loads(node_annotations(kube, first)[VFIO_RESULT_ANNOTATION])
        assert {g["driver"] for g in record["gpus"].values()} == {"vfio-pci"}, record
        # the host-driver node's probe pod reads that host's driver
        wait_for(
            f"the probe's labels on {host}",
            lambda: node_labels(kube, host),
            until=lambda lb: (
                lb.get(DRIVER_SOURCE) == "host" and lb.get(DRIVER_VERSION) == HOST_DRIVER_VERSION
            ),
            timeout=60,
        )
        assert VFIO_STATE not in node_labels(kube, host)  # no vfio manager pod there
    assert agents.error is None, agents.error
    # the second passthrough node ran neither pod: nothing of theirs on it
    assert PROBE_FACTS_ANNOTATION not in node_annotations(kube, second)
    assert VFIO_RESULT_ANNOTATION not in node_annotations(kube, second)
    assert not {PROBE_STATUS, DRIVER_SOURCE, VFIO_STATE} & set(node_labels(kube, second))


def probe_rbac(kube: Client, namespace: str, rules: list[dict[str, Any]]) -> str:
    """The probe's rendered RBAC (render/states/vfio_manager.py: its ServiceAccount, a ClusterRole of
    NODE_RULES, the binding) in `namespace`, with `rules` in place of the rendered ones; the
    ClusterRole named for the namespace (the operator's own is cluster-wide)."""
    role = f"{PROBE_APP}-{namespace}"
    kube.apply(ServiceAccount(metadata=ObjectMeta(name=PROBE_APP, namespace=namespace)), field_manager="test")
    kube.apply(
        cast(ClusterRole, ClusterRole.from_dict({"metadata": {"name": role}, "rules": rules})),
        field_manager="test",
        force=True,
    )
    kube.apply(
        cast(
            ClusterRoleBinding,
            ClusterRoleBinding.from_dict(
                {
                    "metadata": {"name": role},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": PROBE_APP, "namespace": namespace}],
                }
            ),
        ),
        field_manager="test",
    )
    return role


def refusals_in_audit(plane: ControlPlane, user: str) -> set[tuple[str, str, str]]:
    """(verb, resource, name) of each call by `user` the apiserver refused, from the audit log's fields."""
    return {
        (
            str(e.get("verb")),
            str((e.get("objectRef") or {}).get("resource")),
            str((e.get("objectRef") or {}).get("name")),
        )
        for e in plane.audit_all()
        if e.get("stage") == "ResponseComplete"
        and (e.get("user") or {}).get("username") == user
        and status_code(e) == FORBIDDEN
    }


def test_the_probe_writes_with_its_pods_identity_and_a_verb_its_role_lacks_is_refused(
    kube: Client, control_plane: ControlPlane, fake_nodes: Nodes, namespace: str, tmp_path: Path
) -> None:
    """The probe's stand-in calls as the pod's ServiceAccount (a token bound to the pod): with the
    rendered ClusterRole less `patch` on nodes, its publish is refused, named by identity and verb
    in the audit log and in the stand-in's record, and nothing of the probe lands on the Node; with
    the verb back its retry (backoff) publishes."""
    (node,) = fake_nodes("vfio-passthrough:1")
    rendered = [dict(r) for r in vfio_manager.NODE_RULES]
    mutated = [
        {**r, "verbs": [v for v in r["verbs"] if v != "patch"]} if "nodes" in r["resources"] else r
        for r in rendered
    ]
    assert mutated != rendered  # the verb really was in the rendered Role
    role = probe_rbac(kube, namespace, mutated)
    user = f"system:serviceaccount:{namespace}:{PROBE_APP}"
    config = KubeConfig.from_file(control_plane.admin_kubeconfig)
    try:
        with roster.running(config, nodes=False, hosts=tmp_path / "hosts", agents=True) as agents:
            pod = component_pod("probe", namespace, node, PROBE_APP)
            assert pod.spec is not None
            pod.spec.serviceAccountName = PROBE_APP
            pod.spec.containers[0].args = ["--default-workload=vm-passthrough"]
            kube.create(pod)
            refused = wait_for(
                "the probe's Node patch refused (audit log)",
                lambda: refusals_in_audit(control_plane, user),
                until=lambda r: ("patch", "nodes", node) in r,
                timeout=60,
            )
            assert {verb for verb, _, _ in refused} == {"patch"}, refused  # its reads were its Role's
            assert agents.identities is not None
            records = [r for r in agents.identities.refusals.seen if r.identity == user]
            assert {(r.verb, r.resource, r.name) for r in records} == {("patch", "nodes", node)}, records
            assert PROBE_FACTS_ANNOTATION not in node_annotations(kube, node)  # never widened
            # the verb back: the stand-in's retry publishes, as the probe's loop would
            probe_rbac(kube, namespace, rendered)
            wait_for(
                "the probe's facts once its Role allows the patch",
                lambda: node_annotations(kube, node).get(PROBE_FACTS_ANNOTATION, ""),
                timeout=60,
            )
            got = kube.get(Node, node)
            assert got.metadata is not None
            owners = {
                m.manager
                for m in got.metadata.managedFields or []
                if f"f:{PROBE_FACTS_ANNOTATION}" in json.dumps(m.fieldsV1)
            }
            assert owners == {NODE_AGENT_FIELD_MANAGER}, owners
        assert agents.error is None, agents.error
        writers = {
            str((e.get("user") or {}).get("username"))
            for e in control_plane.audit_all()
            if e.get("verb") == "patch"
            and (e.get("objectRef") or {}).get("resource") == "nodes"
            and (e.get("objectRef") or {}).get("name") == node
            and status_code(e) == 200
        }
        assert writers == {user}, writers  # the probe's own identity, not the simulator's admin
    finally:
        delete_if_present(kube, ClusterRoleBinding, role)
        delete_if_present(kube, ClusterRole, role)
