"""GPU sharing as NVIDIA's device plugin, GFD and config-manager read the plugin config
(`sim/standins/sharing.py`), and the kwok stand-ins' config-manager (`sim/standins/pluginconfig.py`) over the pod the
operator renders."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from gpu_operator import shapes
from gpu_operator.sim.standins import gfd, kubeletdp, sharing
from gpu_operator.sim.standins.pluginconfig import PluginConfigs, wiring
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.vocabulary import DEVICE_PLUGIN_CONFIG

SLICE4 = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
SLICE2_RENAMED = """version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""
MPS3 = """version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 3
"""


def test_time_slicing_config_is_read_as_the_plugin_does() -> None:
    got = sharing.parse(SLICE4)
    assert got.strategy == "time-slicing" and got.fail_requests_greater_than_one is False
    assert got.resources == (sharing.Replicated("nvidia.com/gpu", 4, ""),)
    renamed = sharing.parse(SLICE2_RENAMED)
    assert (
        renamed.resources[0].advertised == "nvidia.com/gpu.shared" and renamed.fail_requests_greater_than_one
    )
    # a rename other than the default one is ignored (DisableResourceNamingInConfig)
    custom = sharing.parse(SLICE4.replace("replicas: 4", "replicas: 4\n      rename: gpu-x"))
    assert custom.resources[0].advertised == "nvidia.com/gpu"
    mps = sharing.parse(MPS3)
    assert mps.strategy == "mps" and mps.fail_requests_greater_than_one is True
    assert sharing.parse("") == sharing.Sharing() and sharing.parse(
        "version: v1\nflags:\n  migStrategy: single\n"
    ) == sharing.Sharing(mig_strategy="single")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (SLICE4.replace("replicas: 4", "replicas: 1"), "cfg.sharing.timeSlicing.resources[0].replicas"),
        (
            SLICE4.replace("resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n", "resources: []\n"),
            "cfg.sharing.timeSlicing.resources",
        ),
        (SLICE4.replace("      replicas: 4\n", ""), "cfg.sharing.timeSlicing.resources[0].replicas"),
        (SLICE4.replace("version: v1", "version: v2"), "cfg.version"),
    ],
)
def test_configs_the_plugin_refuses_name_the_field(text: str, field: str) -> None:
    with pytest.raises(sharing.SharingConfigError) as err:
        sharing.parse(text, "cfg")
    assert str(err.value).split(":")[0] == field


def test_config_manager_chooses_label_then_default_then_fallbacks() -> None:
    keys = ["..data", "any", "slice-2"]
    assert sharing.choose("slice-2", keys, "any") == "slice-2"
    assert sharing.choose(None, keys, "any") == "any" and sharing.choose("", keys, "any") == "any"
    assert sharing.choose(None, keys, "", ["empty"]) == ""
    assert sharing.choose(None, ["only"], "", ["named", "single"]) == "only"
    assert sharing.choose(None, ["default", "b"], "", ["named"]) == "default"
    with pytest.raises(sharing.SharingConfigError, match="set the node's label to one of any, slice-2"):
        sharing.choose("nope", keys, "any")
    with pytest.raises(sharing.SharingConfigError, match="devicePlugin.config.default"):
        sharing.choose(None, keys, "missing")
    with pytest.raises(sharing.SharingConfigError, match="all fallbacks failed"):
        sharing.choose(None, ["a", "b"], "", ["named", "single"])


def test_replicas_multiply_devices_with_annotated_ids() -> None:
    devices = {"nvidia.com/gpu": [("GPU-a", 0), ("GPU-b", 1)], "nvidia.com/mig-1g.10gb": [("MIG-c", 2)]}
    got = sharing.replicate(sharing.parse(SLICE4), devices)
    assert got["nvidia.com/gpu"] == [
        ("GPU-a::0", 0),
        ("GPU-a::1", 0),
        ("GPU-a::2", 0),
        ("GPU-a::3", 0),
        ("GPU-b::0", 1),
        ("GPU-b::1", 1),
        ("GPU-b::2", 1),
        ("GPU-b::3", 1),
    ]
    assert got["nvidia.com/mig-1g.10gb"] == [("MIG-c", 2)]  # not named in the config: as it was
    renamed = sharing.replicate(sharing.parse(SLICE2_RENAMED), devices)
    assert "nvidia.com/gpu" not in renamed and len(renamed["nvidia.com/gpu.shared"]) == 4
    assert sharing.device_id("GPU-a::3") == "GPU-a" and sharing.device_id("GPU-a") == "GPU-a"
    assert sharing.too_many(sharing.parse(SLICE2_RENAMED), ["GPU-a::0", "GPU-a::1"]) is not None
    assert sharing.too_many(sharing.parse(SLICE4), ["GPU-a::0", "GPU-a::1"]) is None
    with pytest.raises(sharing.SharingConfigError, match="mixed MIG strategy"):
        sharing.check(sharing.parse(MPS3), "mixed")


def test_gfd_labels_gain_the_sharing_labels() -> None:
    base = shapes.load("dgx-h100").gfd_labels()
    sliced = sharing.gfd_labels(sharing.parse(SLICE4), base, mig_enabled=False)
    assert sliced["nvidia.com/gpu.product"] == f"{base['nvidia.com/gpu.product']}-SHARED"
    assert (
        sliced["nvidia.com/gpu.replicas"] == "4"
        and sliced["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    )
    assert (
        sliced["nvidia.com/mps.capable"] == "false"
        and sliced["nvidia.com/gpu.count"] == base["nvidia.com/gpu.count"]
    )
    renamed = sharing.gfd_labels(sharing.parse(SLICE2_RENAMED), base, mig_enabled=False)
    assert renamed["nvidia.com/gpu.product"] == base["nvidia.com/gpu.product"]  # renamed: no -SHARED
    mps = sharing.gfd_labels(sharing.parse(MPS3), base, mig_enabled=False)
    assert mps["nvidia.com/gpu.sharing-strategy"] == "mps" and mps["nvidia.com/mps.capable"] == "true"
    assert sharing.gfd_labels(sharing.Sharing(), base, mig_enabled=False) == base


# -- the config-manager stand-in over the pod the operator renders --


def rendered_pod(config: dict[str, Any] | None, uid: str = "uid-1") -> PodView:
    from tests.unit.render.renderkit import daemonset, run

    spec = {"devicePlugin": {"config": config}} if config else None
    ds = daemonset(run(spec), "state-device-plugin")
    template = copy.deepcopy(ds["spec"]["template"])
    template["spec"]["nodeName"] = "dgx-h100-0"
    template["metadata"].update(
        name="dp-1", namespace="gpu-operator", uid=uid, creationTimestamp="2026-01-01T00:00:00Z"
    )
    return PodView.of(
        Pod.from_dict({"apiVersion": "v1", "kind": "Pod", **template, "status": {"phase": "Running"}})
    )


class ConfigClient:
    def __init__(self, data: dict[str, str], label: str | None) -> None:
        self.data, self.label, self.reads = data, label, 0

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        if resource is ConfigMap:
            if name != "time-slicing":
                raise ApiError(status=type("S", (), {"code": 404, "message": "not found"})())
            self.reads += 1
            return ConfigMap.from_dict({"metadata": {"name": name}, "data": dict(self.data)})
        labels = {DEVICE_PLUGIN_CONFIG: self.label} if self.label else {}
        return Node.from_dict({"metadata": {"name": name, "labels": labels}})


def test_the_rendered_pod_wires_config_manager_as_the_stand_in_reads_it() -> None:
    pod = rendered_pod({"name": "time-slicing", "default": "any"})
    assert wiring(pod) == ("time-slicing", DEVICE_PLUGIN_CONFIG, "any", ["empty"])
    assert wiring(rendered_pod(None)) is None


def test_a_label_change_is_read_an_edit_of_the_same_key_is_not() -> None:
    client = ConfigClient({"any": SLICE4, "slice-2": SLICE2_RENAMED}, None)
    configs, pod = PluginConfigs(), rendered_pod({"name": "time-slicing", "default": "any"})

    def held() -> sharing.Sharing:
        return asyncio.run(configs.config(client, "dgx-h100-0", pod))  # type: ignore[arg-type]

    assert held().resources[0].replicas == 4  # the default key
    client.data["any"] = SLICE4.replace("replicas: 4", "replicas: 8")
    assert held().resources[0].replicas == 4  # the same link: the plugin reads nothing again
    client.label = "slice-2"
    assert held().resources[0].advertised == "nvidia.com/gpu.shared"  # SIGHUP: read afresh
    client.label = "missing"
    assert held().resources[0].advertised == "nvidia.com/gpu.shared"  # the sidecar exits; the plugin keeps it
    new_pod = rendered_pod({"name": "time-slicing", "default": "any"}, uid="uid-2")
    with pytest.raises(sharing.SharingConfigError, match="does not exist"):
        asyncio.run(configs.config(client, "dgx-h100-0", new_pod))  # type: ignore[arg-type]
    client.label = None
    assert asyncio.run(configs.config(client, "dgx-h100-0", new_pod)).resources[0].replicas == 8  # type: ignore[arg-type]


def test_kwok_capacity_and_gfd_labels_follow_the_held_config() -> None:
    view = StandinNodeView(
        name="dgx-h100-0",
        uid="n",
        labels={shapes.SHAPE_LABEL: "dgx-h100"},
        capacity={},
        shape=shapes.load("dgx-h100"),
    )
    pod = rendered_pod({"name": "time-slicing", "default": "any"})
    player = kubeletdp.DevicePluginCapacity()
    assert player.resources("dgx-h100-0", view, pod, sharing.parse(SLICE4)) == {"nvidia.com/gpu": (32, 0)}
    assert player.resources("dgx-h100-0", view, pod, sharing.parse(SLICE2_RENAMED)) == {
        "nvidia.com/gpu.shared": (16, 0)
    }
    assert player.resources("dgx-h100-0", view, pod) == {"nvidia.com/gpu": (8, 0)}
    assert kubeletdp.is_plugin_resource("nvidia.com/gpu.shared")
    labels = gfd.labels_for(view, pod, None, sharing.parse(SLICE4))
    assert labels["nvidia.com/gpu.replicas"] == "4" and labels["nvidia.com/gpu.product"].endswith("-SHARED")
