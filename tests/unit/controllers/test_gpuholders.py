"""Which pods hold a node's GPUs (controllers/gpuholders.py), and the drain's use of it: device-plugin
resources, gpu.nvidia.com ResourceClaims, NVIDIA's RuntimeClasses and NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpu_operator.api.clusterpolicy import ClusterPolicySpec
from gpu_operator.controllers import drain
from gpu_operator.controllers.gpuholders import (
    RuntimeAccess,
    claim_keys,
    holds_gpu,
    holds_gpu_claim,
    reaches_gpu_by_runtime,
    requests_gpu,
)
from gpu_operator.controllers.units.upgrade import state as us
from gpu_operator.vocabulary import UPGRADE_STATE

DEFAULT = RuntimeAccess.of(ClusterPolicySpec())


def pod(
    *containers: dict[str, Any],
    runtime: str | None = None,
    claims: list[dict[str, Any]] | None = None,
    statuses: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [{"name": "main"}]}
    if runtime:
        spec["runtimeClassName"] = runtime
    if claims:
        spec["resourceClaims"] = claims
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {"name": "p", "namespace": "work"},
        "spec": spec,
        "status": {"phase": "Running", "resourceClaimStatuses": statuses or []},
    }


def env(value: str) -> dict[str, Any]:
    return {"name": "main", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]}


def claim(
    name: str, driver: str = "gpu.nvidia.com", *, admin: bool = False, allocated: bool = True
) -> dict[str, Any]:
    result: dict[str, Any] = {"driver": driver, "pool": "n1", "device": "gpu-0", "request": "gpu"}
    if admin:
        result["adminAccess"] = True
    status = {"allocation": {"devices": {"results": [result]}}} if allocated else {}
    return {"metadata": {"name": name, "namespace": "work"}, "status": status}


TEMPLATE_POD = pod(
    claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    statuses=[{"name": "gpu", "resourceClaimName": "p-gpu-x7"}],
)


def test_device_plugin_resources() -> None:
    assert requests_gpu(pod({"resources": {"limits": {"nvidia.com/gpu": "1"}}}))
    assert requests_gpu(pod({"resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}))
    assert not requests_gpu(pod({"resources": {"requests": {"cpu": "1"}}}))


# MIG profiles with NVML's attribute suffixes, which NVIDIA's device plugin v0.20 advertises as
# resources of their own (sim/standins/migresources.py spells them as the plugin does)
SUFFIXED_PROFILES = ("1g.10gb+me", "1g.10gb+me.all", "1g.24gb+gfx", "2g.48gb+gfx", "1g.24gb-me", "2g.48gb-me")


@pytest.mark.parametrize("profile", SUFFIXED_PROFILES)
@pytest.mark.parametrize("section", ["requests", "limits"])
def test_mig_profiles_with_suffixes_hold_gpus(profile: str, section: str) -> None:
    from gpu_operator.sim.standins.migresources import resource_name

    name = resource_name(profile)
    assert name is not None and name != "nvidia.com/mig-" + profile.split("+")[0].split("-")[0]
    for resource in (name, f"{name}.shared"):  # time-slicing's renamed resource too
        held = pod({"name": "main", "resources": {section: {resource: "1"}}})
        assert requests_gpu(held) and holds_gpu(held, DEFAULT, {}), resource
    # not NVIDIA's device plugin: another vendor's resource of the same shape holds nothing here
    other = pod({"name": "main", "resources": {section: {name.replace("nvidia.com/", "example.com/"): "1"}}})
    assert not requests_gpu(other)


def test_claim_names_come_from_the_spec_or_the_generated_claim() -> None:
    assert claim_keys(TEMPLATE_POD) == [("work", "p-gpu-x7")]
    assert claim_keys(pod(claims=[{"name": "gpu", "resourceClaimName": "shared"}])) == [("work", "shared")]
    # a template's claim not created yet: nothing allocated
    assert claim_keys(pod(claims=[{"name": "gpu", "resourceClaimTemplateName": "t"}])) == []


@pytest.mark.parametrize(
    ("claims", "holds"),
    [
        ({("work", "p-gpu-x7"): claim("p-gpu-x7")}, True),
        ({("work", "p-gpu-x7"): claim("p-gpu-x7", admin=True)}, False),  # a management view consumes nothing
        ({("work", "p-gpu-x7"): claim("p-gpu-x7", "compute-domain.nvidia.com")}, False),
        ({("work", "p-gpu-x7"): claim("p-gpu-x7", allocated=False)}, False),
        ({}, True),  # named but not found: counted, as NVIDIA's operator counts an unreadable claim
        (None, True),  # claims could not be read at all
    ],
)
def test_a_gpu_claim_holds_gpus(claims: dict[tuple[str, str], Any] | None, holds: bool) -> None:
    assert holds_gpu_claim(TEMPLATE_POD, claims) is holds
    assert holds_gpu(TEMPLATE_POD, DEFAULT, claims) is holds


def test_a_pod_without_claims_needs_no_claim_read() -> None:
    assert not holds_gpu_claim(pod(), None)


@pytest.mark.parametrize(
    ("subject", "holds"),
    [
        (pod(env("all"), runtime="nvidia"), True),
        (pod(runtime="nvidia"), True),  # the image's env (CUDA images: all) is not visible here
        (pod(runtime="nvidia-cdi"), True),
        (pod(env("none"), runtime="nvidia"), False),
        (pod(env("void"), {"name": "side"}, runtime="nvidia"), True),  # the sidecar may see them
        (pod(env("void"), runtime="nvidia", init=[{"name": "setup"}]), True),
        (pod(env("all")), False),  # under runc (CDI on: the nvidia runtime is not the default)
        (pod(runtime="kata"), False),
        (pod(), False),
    ],
)
def test_runtime_class_and_visible_devices_under_the_default_policy(
    subject: dict[str, Any], holds: bool
) -> None:
    assert reaches_gpu_by_runtime(subject, DEFAULT) is holds
    assert holds_gpu(subject, DEFAULT, {}) is holds


@pytest.mark.parametrize(
    ("spec", "env_alone"),
    [
        ({}, False),
        ({"cdi": {"enabled": False}}, True),  # the toolkit sets the nvidia runtime as default
        (
            {
                "cdi": {"enabled": False},
                "toolkit": {"env": [{"name": "CONTAINERD_SET_AS_DEFAULT", "value": "false"}]},
            },
            False,
        ),
        ({"toolkit": {"env": [{"name": "NVIDIA_RUNTIME_SET_AS_DEFAULT", "value": "true"}]}}, True),
        ({"toolkit": {"enabled": False}}, True),  # the host's runtime: not ours to know
    ],
)
def test_visible_devices_alone_where_the_nvidia_runtime_is_the_default(
    spec: dict[str, Any], env_alone: bool
) -> None:
    access = RuntimeAccess.of(ClusterPolicySpec.model_validate(spec))
    assert access.env_alone is env_alone
    assert reaches_gpu_by_runtime(pod(env("all")), access) is env_alone
    assert (
        reaches_gpu_by_runtime(
            pod(
                {
                    "name": "m",
                    "env": [
                        {
                            "name": "NVIDIA_VISIBLE_DEVICES",
                            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
                        }
                    ],
                }
            ),
            access,
        )
        is env_alone
    )
    assert not reaches_gpu_by_runtime(pod(env("void")), access)
    assert not reaches_gpu_by_runtime(pod(), access)


def test_the_policys_runtime_class_counts() -> None:
    access = RuntimeAccess.of(ClusterPolicySpec.model_validate({"operator": {"runtimeClass": "nvidia-gpu"}}))
    assert reaches_gpu_by_runtime(pod(env("all"), runtime="nvidia-gpu"), access)
    assert reaches_gpu_by_runtime(pod(runtime="nvidia-legacy"), access)


def facts(
    name: str,
    body: dict[str, Any],
    *,
    owner: str = "ReplicaSet",
    claims: dict[tuple[str, str], Any] | None = None,
) -> us.PodFacts:
    body["metadata"] = {
        "name": name,
        "namespace": body["metadata"]["namespace"],
        "ownerReferences": [{"kind": owner, "controller": True}],
    }
    return drain.pod_facts(body, set(), None, {}, access=DEFAULT, claims=claims)


def node_pods() -> tuple[us.PodFacts, ...]:
    dra = pod(
        claims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        statuses=[{"name": "gpu", "resourceClaimName": "dra-gpu-x7"}],
    )
    return (
        facts("dra", dra, claims={("work", "dra-gpu-x7"): claim("dra-gpu-x7")}),
        facts("runtime", pod(env("all"), runtime="nvidia")),
        facts("plain", pod()),
        facts("plugin", pod(runtime="nvidia"), owner="DaemonSet"),
    )  # an operand: never ours to evict


def test_gpu_pod_deletion_evicts_every_holder_but_never_a_daemonset_pod() -> None:
    node = us.UpgradeNodeFacts("n1", labels={UPGRADE_STATE: us.POD_DELETION_REQUIRED}, pods=node_pods())
    step = us.decide(node, us.Policy(auto_upgrade=True), 100.0, True)
    assert [p.name for p in step.evict] == ["dra", "runtime"]


def test_remediation_drain_uses_the_same_rule() -> None:
    from gpu_operator.api.healthpolicy import RemediationSpec
    from gpu_operator.controllers.units.health import machine as hm

    node = hm.RemediationFacts("n1", state=hm.DRAINING, pods=node_pods())
    step = hm.decide(node, RemediationSpec(enabled=True), 100.0, True)
    assert [p.name for p in step.evict] == ["dra", "runtime"]


class Claims:
    """A Kube stand-in for the claim read: claims by namespace, or an answer for every list."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[str | None] = []

    async def list_resource_claims(self, namespace: str | None = None) -> Any:
        self.asked.append(namespace)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_claims_are_read_once_per_namespace_and_only_where_a_pod_names_one() -> None:
    kube = Claims([claim("p-gpu-x7")])
    other = pod(claims=[{"name": "gpu", "resourceClaimName": "c"}])
    other["metadata"]["namespace"] = "team"
    found = asyncio.run(drain.claims_of(kube, [TEMPLATE_POD, TEMPLATE_POD, other, pod()]))  # type: ignore[arg-type]
    assert kube.asked == ["team", "work"]
    assert found is not None and set(found) == {("team", "p-gpu-x7"), ("work", "p-gpu-x7")}
    none = Claims([])
    assert asyncio.run(drain.claims_of(none, [pod()])) == {} and none.asked == []  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [None, RuntimeError("403 Forbidden")])
def test_claims_that_cannot_be_read_count(answer: Any) -> None:
    claims = asyncio.run(drain.claims_of(Claims(answer), [TEMPLATE_POD]))  # type: ignore[arg-type]
    assert claims is None and holds_gpu(TEMPLATE_POD, DEFAULT, claims)
