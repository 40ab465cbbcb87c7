"""NVIDIADriver pools and VM guests given NVSwitch-fabric GPUs without their NVSwitches: within a pool
those guests get a DaemonSet of their own reading the CR's merged kernel-module ConfigMap, the
pool's DaemonSet stays off them; the ClusterPolicy's spec.driver.guestNVLink decides."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.nvidiadriver import NVIDIADriver
from gpu_operator.render import RenderResult
from gpu_operator.render.facts import ClusterFacts
from gpu_operator.render.guestnvlink import CONFIGMAP, DAEMONSET_SUFFIX
from gpu_operator.render.nvidiadriver import (
    OWNER_LABEL,
    daemonset_name,
    guest_configmap_name,
    node_pools,
    pools_of,
    render_nvidiadriver,
)
from gpu_operator.vocabulary import NFD_DEVICE_LABEL_PREFIX, NVSWITCH_DEVICES
from tests.unit.render.renderkit import IMAGES, K8S, facts, nodes, policy

UID = "0b6d3f1e-8a2c-4e9f-b7d5-1c3a5e7f9b2d"
GUEST = "kubevirt-guest-h100-0"
BARE = "dgx-h100-0"
SHAPES = ("dgx-h100:1", "kubevirt-guest-h100:1")


def nvd(name: str = "pool-a", uid: str = UID, **spec: Any) -> NVIDIADriver:
    return NVIDIADriver.model_validate({"metadata": {"name": name, "uid": uid}, "spec": spec})


def render(cr: NVIDIADriver, *shapes: str, user: dict[str, str] | None = None, **kwargs: Any) -> RenderResult:
    keys = {"kmods": tuple(sorted(user))} if user is not None else {}
    data = {"kmods": user} if user is not None else {}
    cluster = facts(*(shapes or SHAPES), configmap_keys=keys, configmap_data=data)
    return render_nvidiadriver(cr, cluster, **kwargs)


def pool_daemonsets(result: RenderResult) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for s in pools_of(result) for o in s.objects}


def shared(result: RenderResult) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in result.state("state-driver").objects}


def node_terms(ds: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = ds["spec"]["template"]["spec"].get("affinity", {}).get("nodeAffinity")
    return affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] if affinity else []


def name_fields(ds: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for t in node_terms(ds) for f in t.get("matchFields", [])]


def module_configmap(ds: dict[str, Any]) -> str | None:
    volumes = ds["spec"]["template"]["spec"]["volumes"]
    found = [v["configMap"]["name"] for v in volumes if v["name"] == "kernel-module-config"]
    return found[0] if found else None


def names(cr: NVIDIADriver) -> tuple[str, str]:
    pool = node_pools(cr, facts(*SHAPES).gpu_nodes)[0][0]
    return daemonset_name(cr, pool), daemonset_name(cr, pool, DAEMONSET_SUFFIX)


def test_guest_gets_its_own_pool_daemonset_and_the_pool_keeps_off_it() -> None:
    cr = nvd()
    result = render(cr)
    main, guest = names(cr)
    assert guest == f"{main}{DAEMONSET_SUFFIX}"
    by_name = pool_daemonsets(result)
    assert sorted(by_name) == [main, guest]
    assert [s.name for s in pools_of(result)] == ["pool ubuntu22.04"]  # one pool, two DaemonSets
    assert name_fields(by_name[main]) == [{"key": "metadata.name", "operator": "NotIn", "values": [GUEST]}]
    assert name_fields(by_name[guest]) == [{"key": "metadata.name", "operator": "In", "values": [GUEST]}]
    for name, ds in by_name.items():  # selectable on their own, still the CR's pool
        assert ds["spec"]["selector"] == {"matchLabels": {"app": name}}
        assert ds["spec"]["template"]["spec"]["nodeSelector"][OWNER_LABEL] == "pool-a"
    cm = guest_configmap_name(cr)
    assert cm == "nvidia-gpu-driver-pool-a-guest-nvlink-off"
    assert module_configmap(by_name[guest]) == cm and module_configmap(by_name[main]) is None
    objects = shared(result)
    assert objects[("ConfigMap", cm)]["data"] == {"nvidia.conf": "NVreg_NvLinkDisable=1\n"}
    assert ("ConfigMap", CONFIGMAP) not in objects  # the ClusterPolicy's name is not used


def test_the_crs_kernel_module_config_is_merged_and_its_value_wins() -> None:
    user = {
        "nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\n",
        "nvidia-uvm.conf": "uvm_perf_prefetch_enable=0\n",
    }
    cr = nvd(kernelModuleConfig={"name": "kmods"})
    result = render(cr, user=dict(user))
    main, guest = names(cr)
    assert shared(result)[("ConfigMap", guest_configmap_name(cr))]["data"] == {
        **user,
        "nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\nNVreg_NvLinkDisable=1\n",
    }
    by_name = pool_daemonsets(result)
    assert module_configmap(by_name[main]) == "kmods"  # the bare-metal node reads the user's as before
    assert module_configmap(by_name[guest]) == guest_configmap_name(cr)
    assert not [o for s in result.states for o in s.objects if o["metadata"]["name"] == "kmods"]  # read only
    own = {"nvidia.conf": "NVreg_NvLinkDisable=0\n"}
    kept = render(cr, user=dict(own))
    assert shared(kept)[("ConfigMap", guest_configmap_name(cr))]["data"] == own


def with_nvswitch() -> ClusterFacts:
    """The guest given its NVSwitches too (Fabric Manager's full-passthrough model)."""
    cluster = nodes(*SHAPES)
    for node in cluster:
        if node["metadata"]["name"] == GUEST:
            node["metadata"]["labels"][f"{NFD_DEVICE_LABEL_PREFIX}{NVSWITCH_DEVICES[0]}.present"] = "true"
    return ClusterFacts.from_nodes(cluster, namespace="gpu-operator", k8s_version=K8S, operator_env=IMAGES)


def test_nothing_is_split_when_no_guest_needs_it() -> None:
    for cluster in (facts("dgx-h100:2"), with_nvswitch()):
        result = render_nvidiadriver(nvd(), cluster)
        assert len(pools_of(result)) == 1 and all(len(s.objects) == 1 for s in pools_of(result))
        assert not [n for n in pool_daemonsets(result) if n.endswith(DAEMONSET_SUFFIX)]
        assert all(name_fields(ds) == [] for ds in pool_daemonsets(result).values())
        assert ("ConfigMap", guest_configmap_name(nvd())) not in shared(result)


def test_the_cluster_policys_guest_nvlink_decides() -> None:
    leave = policy({"driver": {"useNvidiaDriverCRD": True, "guestNVLink": "leave"}})
    result = render(nvd(), base=leave)
    assert list(pool_daemonsets(result)) == [names(nvd())[0]]
    assert ("ConfigMap", guest_configmap_name(nvd())) not in shared(result)
    default = policy({"driver": {"useNvidiaDriverCRD": True}})
    assert sorted(pool_daemonsets(render(nvd(), base=default))) == sorted(names(nvd()))


def test_only_the_crs_own_nodes_are_split() -> None:
    result = render(nvd(), owned=[BARE])
    assert list(pool_daemonsets(result)) == [names(nvd())[0]]
    assert ("ConfigMap", guest_configmap_name(nvd())) not in shared(result)


def test_names_stay_within_63_characters_and_apart() -> None:
    long_a, long_b = "a" * 60 + "-one", "a" * 60 + "-two"
    first, second = nvd(long_a, uid="uid-1"), nvd(long_b, uid="uid-2")
    cms = {guest_configmap_name(first), guest_configmap_name(second)}
    assert len(cms) == 2 and all(len(n) <= 63 and n.endswith(DAEMONSET_SUFFIX) for n in cms)
    daemonsets = {*names(first), *names(second)}
    assert len(daemonsets) == 4 and all(len(n) <= 63 for n in daemonsets)
    result = render(first)
    assert sorted(pool_daemonsets(result)) == sorted(names(first))
    assert ("ConfigMap", guest_configmap_name(first)) in shared(result)


def test_precompiled_pools_each_split() -> None:
    cr = nvd(usePrecompiled=True)
    result = render(cr)
    by_name = pool_daemonsets(result)
    guests = [n for n in by_name if n.endswith(DAEMONSET_SUFFIX)]
    assert len(guests) == 1 and len(by_name) >= 2
    pool = next(s for s in pools_of(result) if guests[0] in {o["metadata"]["name"] for o in s.objects})
    assert [o["metadata"]["name"] for o in pool.objects] == [
        guests[0].removesuffix(DAEMONSET_SUFFIX),
        guests[0],
    ]


def test_the_crs_node_affinity_keeps_the_split() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    cr = nvd(nodeAffinity={"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}})
    main, guest = names(cr)
    by_name = pool_daemonsets(render(cr))
    for name, operator in ((main, "NotIn"), (guest, "In")):
        assert node_terms(by_name[name]) == [
            {**term, "matchFields": [{"key": "metadata.name", "operator": operator, "values": [GUEST]}]}
        ]
    assert term == {
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
    }  # the CR's untouched
