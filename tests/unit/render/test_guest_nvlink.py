"""NVLink in VM guests: the driver DaemonSet of guest nodes given NVSwitch-fabric GPUs without their
NVSwitches reads our ConfigMap, the user's kernelModuleConfig merged with NVreg_NvLinkDisable=1."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from gpu_operator.render import ClusterFacts, RenderResult, render
from gpu_operator.render.guestnvlink import CONFIGMAP, DAEMONSET_SUFFIX, merged
from gpu_operator.vocabulary import NFD_DEVICE_LABEL_PREFIX, NFD_HYPERVISOR
from tests.unit.render.renderkit import IMAGES, K8S, nodes, policy, run

GUEST = "kubevirt-guest-h100-0"
MAIN = "nvidia-driver-daemonset"


def driver_objects(result: RenderResult) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in result.state("state-driver").objects}


def node_fields(ds: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = ds["spec"]["template"]["spec"].get("affinity", {}).get("nodeAffinity")
    if not affinity:
        return []
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [f for t in terms for f in t.get("matchFields", [])]


def module_volume(ds: dict[str, Any]) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = ds["spec"]["template"]["spec"]["volumes"]
    [volume] = [v for v in volumes if v["name"] == "kernel-module-config"]
    return volume


def guest_run(driver: dict[str, Any] | None = None, user: dict[str, str] | None = None) -> RenderResult:
    keys = {"kmods": tuple(sorted(user))} if user is not None else {}
    data = {"kmods": user} if user is not None else {}
    return run(
        {"driver": driver or {}},
        "dgx-h100:1",
        "kubevirt-guest-h100:1",
        configmap_keys=keys,
        configmap_data=data,
    )


def test_bare_metal_only_renders_as_before() -> None:
    objects = driver_objects(run({}, "dgx-h100:2"))
    assert [name for kind, name in objects if kind == "DaemonSet"] == [MAIN]
    assert node_fields(objects[("DaemonSet", MAIN)]) == []
    assert ("ConfigMap", CONFIGMAP) not in objects


def test_guest_without_user_configmap_gets_the_parameter_alone() -> None:
    objects = driver_objects(guest_run())
    main, guest = objects[("DaemonSet", MAIN)], objects[("DaemonSet", MAIN + DAEMONSET_SUFFIX)]
    assert node_fields(main) == [{"key": "metadata.name", "operator": "NotIn", "values": [GUEST]}]
    assert node_fields(guest) == [{"key": "metadata.name", "operator": "In", "values": [GUEST]}]
    assert objects[("ConfigMap", CONFIGMAP)]["data"] == {"nvidia.conf": "NVreg_NvLinkDisable=1\n"}
    assert module_volume(guest)["configMap"]["name"] == CONFIGMAP
    assert not [v for v in main["spec"]["template"]["spec"]["volumes"] if v["name"] == "kernel-module-config"]
    # the two pods install differently: their driver digests differ
    digests = [
        {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}[
            "DRIVER_CONFIG_DIGEST"
        ]
        for ds in (main, guest)
    ]
    assert digests[0] != digests[1]


def test_user_configmap_is_merged_and_left_untouched() -> None:
    user = {"nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2", "nvidia-uvm.conf": "uvm_perf_prefetch_enable=0\n"}
    objects = driver_objects(guest_run({"kernelModuleConfig": {"name": "kmods"}}, dict(user)))
    assert objects[("ConfigMap", CONFIGMAP)]["data"] == {
        "nvidia.conf": "NVreg_EnableGpuFirmwareLogs=2\nNVreg_NvLinkDisable=1\n",
        "nvidia-uvm.conf": "uvm_perf_prefetch_enable=0\n",
    }
    assert not [o for (kind, name), o in objects.items() if name == "kmods"]  # the user's is never rendered
    assert module_volume(objects[("DaemonSet", MAIN)])["configMap"]["name"] == "kmods"
    guest_items = module_volume(objects[("DaemonSet", MAIN + DAEMONSET_SUFFIX)])["configMap"]["items"]
    assert [i["key"] for i in guest_items] == ["nvidia-uvm.conf", "nvidia.conf"]


@pytest.mark.parametrize("line", ["NVreg_NvLinkDisable=0", " NVreg_NvLinkDisable = 0 "])
def test_the_users_value_wins(line: str) -> None:
    user = {"nvidia.conf": f"NVreg_EnableGpuFirmwareLogs=2\n{line}\n"}
    objects = driver_objects(guest_run({"kernelModuleConfig": {"name": "kmods"}}, dict(user)))
    assert objects[("ConfigMap", CONFIGMAP)]["data"] == user


def test_policy_opt_out_leaves_the_driver_as_nvidias() -> None:
    objects = driver_objects(
        guest_run({"guestNVLink": "leave", "kernelModuleConfig": {"name": "kmods"}}, {"nvidia.conf": "x=1\n"})
    )
    assert [name for kind, name in objects if kind == "DaemonSet"] == [MAIN]
    assert node_fields(objects[("DaemonSet", MAIN)]) == []
    assert ("ConfigMap", CONFIGMAP) not in objects


def test_bad_policy_value_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        policy({"driver": {"guestNVLink": "off"}})
    assert [e["loc"] for e in err.value.errors()] == [("spec", "driver", "guestNVLink")]


def _facts(mutate: dict[str, str | None]) -> ClusterFacts:
    found = nodes("kubevirt-guest-h100:1")
    labels = found[0]["metadata"]["labels"]
    for key, value in mutate.items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    return ClusterFacts.from_nodes(found, namespace="gpu-operator", k8s_version=K8S, operator_env=IMAGES)


@pytest.mark.parametrize(
    ("mutate", "guest"),
    [
        ({}, True),
        ({NFD_HYPERVISOR: None}, False),  # bare metal: NVIDIA's behaviour
        ({f"{NFD_DEVICE_LABEL_PREFIX}22a3.present": "true"}, False),  # NVSwitches given to the VM too
        (
            {
                f"{NFD_DEVICE_LABEL_PREFIX}2330.present": None,
                f"{NFD_DEVICE_LABEL_PREFIX}2331.present": "true",
            },
            False,
        ),
    ],
    ids=["sxm-guest", "not-a-guest", "nvswitch-in-guest", "pcie-guest"],
)
def test_which_nodes_need_nvlink_off(mutate: dict[str, str | None], guest: bool) -> None:
    objects = driver_objects(render(policy({}), _facts(mutate)))
    assert (("DaemonSet", MAIN + DAEMONSET_SUFFIX) in objects) is guest


def test_precompiled_drivers_split_per_kernel() -> None:
    objects = driver_objects(guest_run({"usePrecompiled": True}))
    names = sorted(name for kind, name in objects if kind == "DaemonSet")
    assert names == [
        "nvidia-driver-daemonset-5.15.0-119-generic-ubuntu22.04",
        "nvidia-driver-daemonset-5.15.0-119-generic-ubuntu22.04" + DAEMONSET_SUFFIX,
    ]
    guest = objects[("DaemonSet", names[1])]
    assert guest["spec"]["template"]["spec"]["nodeSelector"]["feature.node.kubernetes.io/kernel-version.full"]
    assert node_fields(guest) == [{"key": "metadata.name", "operator": "In", "values": [GUEST]}]


def test_merge_rules() -> None:
    assert merged(None) == {"nvidia.conf": "NVreg_NvLinkDisable=1\n"}
    assert merged({"nvidia.conf": "a=1\n"}) == {"nvidia.conf": "a=1\nNVreg_NvLinkDisable=1\n"}
    assert merged({"nvidia.conf": "NVreg_NvLinkDisable=1"}) == {"nvidia.conf": "NVreg_NvLinkDisable=1"}
    user = {"nvidia-modeset.conf": "m=1\n"}
    assert merged(user) == {"nvidia-modeset.conf": "m=1\n", "nvidia.conf": "NVreg_NvLinkDisable=1\n"}
    assert user == {"nvidia-modeset.conf": "m=1\n"}  # the input is not changed
