"""Operator scenarios on the real control plane (apiserver + etcd for SSA, CRD validation and
status; controller-manager for DaemonSet pods and garbage collection; scheduler; kwok nodes)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Node, ServiceAccount
from lightkube.types import PatchType

from gpu_operator.kube.client import ClusterPolicyResource
from gpu_operator.sim.plane.operator_process import OperatorProcess
from tests.support.status import policy_status, reconciled
from tests.support.waiting import wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
Start = Callable[..., OperatorProcess]
Nodes = Callable[..., list[str]]
Policies = Callable[..., str]


def labels_of(kube: Client, node: str) -> dict[str, str]:
    return dict(kube.get(Node, node).metadata.labels or {})


def daemonsets(kube: Client, namespace: str) -> dict[str, Any]:
    return {str(ds.metadata.name): ds for ds in kube.list(DaemonSet, namespace=namespace)}


def example_spec(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / name).read_text())["spec"])


def patch_spec(kube: Client, spec: dict[str, Any], name: str = "cluster-policy") -> None:
    kube.patch(ClusterPolicyResource, name, {"spec": spec}, patch_type=PatchType.MERGE)


def reconciled_with(
    kube: Client, fake_nodes: Nodes, start_operator: Start, cluster_policies: Policies, *shapes: str
) -> OperatorProcess:
    """Fake nodes, the operator and a default ClusterPolicy, waited until Reconciled."""
    fake_nodes(*shapes)
    operator = start_operator()
    cluster_policies({})
    reconciled(kube, context=operator.log_text)
    return operator


def test_vm_passthrough_nodes_get_sandbox_stack_only(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    names = fake_nodes("vfio-passthrough:2")
    operator = start_operator()
    cluster_policies(example_spec("clusterpolicy-vm-passthrough.yaml"))
    reconciled(kube, context=operator.log_text)
    for name in names:
        labels = labels_of(kube, name)
        for component in ("sandbox-device-plugin", "sandbox-validator", "vfio-manager"):
            assert labels.get(f"nvidia.com/gpu.deploy.{component}") == "true", (name, component)
        for component in ("driver", "container-toolkit", "device-plugin", "operator-validator"):
            assert f"nvidia.com/gpu.deploy.{component}" not in labels, (name, component)
    found = daemonsets(kube, operator_namespace)
    for ds in ("nvidia-vfio-manager", "nvidia-sandbox-validator", "nvidia-sandbox-device-plugin-daemonset"):
        assert found[ds].status.numberReady == 2, ds
    # Container operands may exist (their states are enabled) but schedule on no passthrough node.
    for name, ds in found.items():
        if name in (
            "nvidia-driver-daemonset",
            "nvidia-device-plugin-daemonset",
            "nvidia-container-toolkit-daemonset",
            "nvidia-operator-validator",
        ):
            assert ds.status.desiredNumberScheduled == 0, name


def test_disabling_a_component_deletes_its_objects_and_enabling_restores_them(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    operator = reconciled_with(kube, fake_nodes, start_operator, cluster_policies, "dgx-h100:2")
    assert "nvidia-device-plugin-daemonset" in daemonsets(kube, operator_namespace)

    patch_spec(kube, {"devicePlugin": {"enabled": False}})
    wait_for(
        "device plugin DaemonSet and ServiceAccount deleted",
        lambda: (
            "nvidia-device-plugin-daemonset" not in daemonsets(kube, operator_namespace)
            and "nvidia-device-plugin"
            not in {sa.metadata.name for sa in kube.list(ServiceAccount, namespace=operator_namespace)}
        ),
        context=operator.log_text,
    )
    patch_spec(kube, {"devicePlugin": {"enabled": True}})
    wait_for(
        "device plugin DaemonSet back and ready",
        lambda: (
            (ds := daemonsets(kube, operator_namespace).get("nvidia-device-plugin-daemonset")) is not None
            and ds.status is not None
            and ds.status.numberReady == 2
        ),
        context=operator.log_text,
    )
    reconciled(kube, context=operator.log_text)  # Reconciled again


def test_late_gpu_node_is_labelled_and_stripped_when_its_gpu_goes(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    operator = reconciled_with(kube, fake_nodes, start_operator, cluster_policies, "dgx-h100:1")

    late = fake_nodes("dgx-h100:1")[0]
    wait_for(
        "the late node labelled",
        lambda: labels_of(kube, late).get("nvidia.com/gpu.deploy.device-plugin") == "true",
        context=operator.log_text,
    )
    wait_for(
        "the device plugin on 2 nodes",
        lambda: (
            daemonsets(kube, operator_namespace)["nvidia-device-plugin-daemonset"].status.numberReady == 2
        ),
    )

    kube.patch(
        Node,
        late,
        {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": None}}},
        patch_type=PatchType.MERGE,
    )
    wait_for(
        "deploy labels stripped",
        lambda: not any(k.startswith("nvidia.com/gpu.deploy.") for k in labels_of(kube, late)),
        context=operator.log_text,
    )
    assert labels_of(kube, late)["nvidia.com/gpu.present"] == "false"


def test_operator_never_overwrites_a_non_empty_deploy_label(
    kube: Client, fake_nodes: Nodes, start_operator: Start, cluster_policies: Policies
) -> None:
    node = fake_nodes("host-driver:1")[0]
    # What k8s-driver-manager writes on a host that already has the driver.
    kube.patch(
        Node,
        node,
        {"metadata": {"labels": {"nvidia.com/gpu.deploy.driver": "pre-installed"}}},
        patch_type=PatchType.MERGE,
    )
    operator = start_operator()
    cluster_policies({})
    wait_for(
        "labelled",
        lambda: labels_of(kube, node).get("nvidia.com/gpu.deploy.device-plugin") == "true",
        context=operator.log_text,
    )
    assert labels_of(kube, node)["nvidia.com/gpu.deploy.driver"] == "pre-installed"


def test_second_cluster_policy_is_ignored(
    kube: Client, fake_nodes: Nodes, start_operator: Start, cluster_policies: Policies
) -> None:
    operator = reconciled_with(kube, fake_nodes, start_operator, cluster_policies, "dgx-h100:1")
    # creationTimestamp has a resolution of one second: the second policy must be created in a later one
    first = kube.get(ClusterPolicyResource, "cluster-policy").metadata.creationTimestamp
    assert first is not None
    wait_for(
        "a second later than the first policy's creationTimestamp",
        lambda: dt.datetime.now(dt.UTC).replace(microsecond=0),
        until=lambda now: now > first,
        interval=0.1,
        timeout=5,
    )
    cluster_policies({}, name="second-policy")
    wait_for(
        "second policy ignored",
        lambda: policy_status(kube, "second-policy").get("state") == "ignored",
        context=operator.log_text,
    )
    assert policy_status(kube)["state"] == "ready"


def test_deleting_the_policy_garbage_collects_what_it_owned(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    operator = reconciled_with(kube, fake_nodes, start_operator, cluster_policies, "dgx-h100:1")
    # An object in the namespace that the operator did not create must survive.
    kube.create(ServiceAccount(metadata=ObjectMeta(name="users-own", namespace=operator_namespace)))
    assert daemonsets(kube, operator_namespace)

    kube.delete(ClusterPolicyResource, "cluster-policy")

    def service_accounts() -> set[str]:
        return {str(sa.metadata.name) for sa in kube.list(ServiceAccount, namespace=operator_namespace)}

    wait_for(
        "owned DaemonSets and ServiceAccounts garbage-collected",
        lambda: not daemonsets(kube, operator_namespace) and "nvidia-device-plugin" not in service_accounts(),
        context=operator.log_text,
    )
    assert "users-own" in service_accounts()


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    fake_nodes("dgx-h100:2")
    cluster_policies({})
    first = start_operator()
    wait_for(
        "the first DaemonSet applied",
        lambda: daemonsets(kube, operator_namespace),
        timeout=60,
        context=first.log_text,
    )
    first.kill()
    second = start_operator()
    reconciled(kube, context=second.log_text)  # Reconciled after restart
    found = daemonsets(kube, operator_namespace)
    assert len(found) == len(set(found))
    for ds in found.values():
        refs = ds.metadata.ownerReferences or []
        assert [r.kind for r in refs] == ["ClusterPolicy"], ds.metadata.name
        assert ds.status.desiredNumberScheduled in (0, 2)


def test_unsatisfiable_policy_is_reported_and_other_work_goes_on(
    kube: Client, fake_nodes: Nodes, start_operator: Start, cluster_policies: Policies
) -> None:
    node = fake_nodes("dgx-h100:1")[0]
    # No DRIVER_IMAGE fallback and no image in the policy: it loads but cannot be rendered.
    operator = start_operator(env={"DRIVER_IMAGE": ""})
    cluster_policies({})

    def reported() -> Any:
        status = policy_status(kube)
        errors = [
            c
            for c in status.get("conditions", [])
            if c["type"] == "Error" and c["status"] == "True" and c["reason"] == "ReconcileFailed"
        ]
        return status.get("state") == "notReady" and errors and errors[0]

    error = wait_for("notReady with a ReconcileFailed Error condition", reported, context=operator.log_text)
    assert "spec.driver" in error["message"], error
    # Node labelling is independent of rendering and still happens.
    wait_for(
        "node labelled anyway", lambda: labels_of(kube, node).get("nvidia.com/gpu.deploy.driver") == "true"
    )

    patch_spec(kube, {"driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "595.91.07"}})
    reconciled(kube, context=operator.log_text)  # Reconciled once the field is fixed


def test_schema_rejects_invalid_policy(kube: Client, crds: list[str]) -> None:
    try:
        kube.create(
            ClusterPolicyResource(  # type: ignore[call-overload]  # metadata as a dict
                apiVersion="nvidia.com/v1",
                kind="ClusterPolicy",
                metadata={"name": "bad-policy"},
                spec={"sandboxWorkloads": {"defaultWorkload": "vm-everything"}},
            )
        )
    except ApiError as err:
        assert err.status.code == 422
        assert "defaultWorkload" in str(err.status.message)
    else:
        kube.delete(ClusterPolicyResource, "bad-policy")
        raise AssertionError("the apiserver accepted an invalid defaultWorkload")


def test_missing_configmap_is_named_and_picked_up_once_created(
    kube: Client,
    fake_nodes: Nodes,
    start_operator: Start,
    cluster_policies: Policies,
    operator_namespace: str,
) -> None:
    fake_nodes("dgx-h100:1")
    operator = start_operator()
    cluster_policies({"driver": {"repoConfig": {"configMapName": "custom-repo"}}})

    def error_message() -> str:
        conditions = policy_status(kube).get("conditions", [])
        return next(
            (
                c["message"]
                for c in conditions
                if c["type"] == "Error" and c["status"] == "True" and c["reason"] == "ReconcileFailed"
            ),
            "",
        )

    message = wait_for("a ReconcileFailed Error condition", error_message, context=operator.log_text)
    assert "spec.driver.repoConfig.configMapName" in message
    kube.create(
        ConfigMap(
            metadata=ObjectMeta(name="custom-repo", namespace=operator_namespace),
            data={"custom.list": "deb http://repo.example.com/ jammy main"},
        )
    )
    reconciled(kube, context=operator.log_text)  # Reconciled once the ConfigMap exists
    driver = kube.get(DaemonSet, "nvidia-driver-daemonset", namespace=operator_namespace)
    mounts = [m.mountPath for c in driver.spec.template.spec.containers for m in c.volumeMounts or []]
    assert any(path.endswith("custom.list") for path in mounts), mounts
