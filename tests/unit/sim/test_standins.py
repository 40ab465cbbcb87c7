"""The simulator's node stand-ins without a cluster: GPU feature discovery's NodeFeature (name,
labels, owner references, written only on change), the device plugin's capacity through the
kubelet (allocatable 0 at once, capacity until the grace period), the DRA slice's devices and
NFD master's JSON patch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod

from gpu_operator import shapes
from gpu_operator.shapes import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from gpu_operator.sim.standins import draplugin, gfd, kubeletdp, nfdmaster
from gpu_operator.sim.standins.podwatch import NodeStandIns, PodView, StandinNodeView, WorkQueue


def pod(
    name: str = "gfd-abc",
    running: bool = True,
    env: dict[str, str] | None = None,
    uid: str = "pod-uid",
    owned: bool = True,
    terminating: bool = False,
) -> PodView:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "gpu-operator",
        "uid": uid,
        "labels": {"app": gfd.APP},
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": "gpu-feature-discovery",
                "uid": "ds-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    env_list = [{"name": k, "value": v} for k, v in (env or {}).items()]
    return PodView.of(
        Pod.from_dict(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {
                    "nodeName": "dgx-h100-0",
                    "containers": [{"name": "gpu-feature-discovery", "image": "gfd", "env": env_list}],
                },
                "status": {"phase": "Running" if running else "Pending", "startTime": "2026-01-01T00:00:10Z"},
            }
        )
    )


def view(
    shape: str = "dgx-h100",
    labels: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
    name: str = "dgx-h100-0",
) -> StandinNodeView:
    return StandinNodeView(
        name=name,
        uid="node-uid",
        labels={shapes.SHAPE_LABEL: shape, **(labels or {})},
        capacity=capacity or {},
        shape=shapes.load(shape),
    )


class FakeClient:
    """Records writes; `stored` answers gets (404 when absent)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.stored: dict[str, Any] = {}

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        self.calls.append(("get", name))
        if name not in self.stored:
            raise ApiError(status=type("S", (), {"code": 404, "message": "not found"})())
        return gfd.NodeFeature.from_dict(self.stored[name])

    async def create(self, obj: Any, field_manager: str | None = None) -> None:
        body = obj.to_dict()
        self.calls.append(("create", (body, field_manager)))
        self.stored[body["metadata"]["name"]] = body

    async def replace(self, obj: Any, field_manager: str | None = None) -> None:
        body = obj.to_dict()
        self.calls.append(("replace", (body, field_manager)))
        self.stored[body["metadata"]["name"]] = body

    async def patch(self, resource: Any, name: str, body: Any, **kwargs: Any) -> None:
        self.calls.append(("patch", (name, body, kwargs)))

    def writes(self) -> list[str]:
        return [c[0] for c in self.calls if c[0] != "get"]


def test_pod_view_reads_phase_owner_env_and_start() -> None:
    seen = pod(env={"MIG_STRATEGY": "single"})
    assert seen.running and seen.node == "dgx-h100-0" and seen.app == gfd.APP
    assert seen.daemonset == {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "gpu-feature-discovery",
        "uid": "ds-uid",
    }
    assert seen.env == {"MIG_STRATEGY": "single"} and seen.started == 1767225610
    assert not pod(terminating=True).running and not pod(running=False).running


def test_node_feature_body_is_gfds() -> None:
    labels = gfd.labels_for(view(), pod())
    body = gfd.node_feature("dgx-h100-0", pod(), labels)
    assert body["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1" and body["kind"] == "NodeFeature"
    assert body["metadata"]["name"] == "nvidia-features-for-dgx-h100-0"
    assert body["metadata"]["namespace"] == "gpu-operator"
    assert body["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "dgx-h100-0"}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "gpu-feature-discovery",
            "uid": "ds-uid",
            "controller": True,
        },
        {"apiVersion": "v1", "kind": "Pod", "name": "gfd-abc", "uid": "pod-uid"},
    ]
    assert body["spec"] == {
        "features": {"flags": {}, "attributes": {}, "instances": {}},
        "labels": shapes.load("dgx-h100").gfd_labels(timestamp=1767225610),
    }
    assert "ownerReferences" not in gfd.node_feature("n", pod(owned=False), labels)["metadata"]


@pytest.mark.parametrize(
    ("env", "strategy", "stamped"),
    [
        ({}, None, True),
        ({"MIG_STRATEGY": "single"}, "single", True),
        ({"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single"}, "mixed", True),
        ({"GFD_NO_TIMESTAMP": "true"}, None, False),
    ],
)
def test_gfd_reads_its_environment(env: dict[str, str], strategy: str | None, stamped: bool) -> None:
    labels = gfd.labels_for(view(), pod(env=env))
    assert labels.get("nvidia.com/mig.strategy") == strategy
    assert ("nvidia.com/gfd.timestamp" in labels) is stamped


def test_no_labels_where_the_gpus_go_to_vms() -> None:
    assert gfd.labels_for(view("vfio-passthrough"), pod()) == {}
    assert gfd.labels_for(view(labels={"nvidia.com/gpu.workload.config": "vm-passthrough"}), pod()) == {}


def test_gfd_creates_then_writes_only_on_change() -> None:
    client, player = FakeClient(), gfd.FeatureDiscovery()

    async def go() -> None:
        await player.sync(client, "dgx-h100-0", view(), [pod()])  # type: ignore[arg-type]
        await player.sync(client, "dgx-h100-0", view(), [pod()])  # type: ignore[arg-type]
        await player.sync(client, "dgx-h100-0", view(), [pod(running=False)])  # type: ignore[arg-type]
        assert client.writes() == ["create"]  # nothing on a repeat, nothing deleted when the pod goes
        fresh = gfd.FeatureDiscovery()  # a restarted stand-in: get, equal, no write
        await fresh.sync(client, "dgx-h100-0", view(), [pod()])  # type: ignore[arg-type]
        assert client.writes() == ["create"]
        await player.sync(client, "dgx-h100-0", view(), [pod(name="gfd-new", uid="new-uid")])  # type: ignore[arg-type]
        assert client.writes() == ["create", "replace"]
        body, manager = client.calls[-1][1]
        assert manager == "gpu-feature-discovery"
        assert body["metadata"]["ownerReferences"][1]["uid"] == "new-uid"

    asyncio.run(go())


def test_gfd_writes_nothing_on_a_cpu_node() -> None:
    client = FakeClient()
    asyncio.run(gfd.FeatureDiscovery().sync(client, "cpu-0", view("cpu", name="cpu-0"), [pod()]))  # type: ignore[arg-type]
    assert client.calls == []


@pytest.mark.parametrize(
    ("running", "stopped_for", "capacity", "allocatable"),
    [(True, 0.0, "8", "8"), (False, 10.0, "8", "0"), (False, 300.0, "8", "0"), (False, 301.0, "0", "0")],
)
def test_desired_status(running: bool, stopped_for: float, capacity: str, allocatable: str) -> None:
    status = kubeletdp.desired_status(8, running, stopped_for)
    assert status == {
        "capacity": {"nvidia.com/gpu": capacity},
        "allocatable": {"nvidia.com/gpu": allocatable},
    }
    assert kubeletdp.desired_status(8, False, None) is None


def test_device_plugin_capacity_follows_the_pod_and_the_grace_period() -> None:
    now = [100.0]
    client = FakeClient()
    player = kubeletdp.DevicePluginCapacity(grace_period=30.0, clock=lambda: now[0])

    def patches() -> list[dict[str, Any]]:
        return [c[1][1]["status"] for c in client.calls if c[0] == "patch"]

    async def go() -> None:
        assert await player.sync(client, "dgx-h100-0", view(), []) is None  # type: ignore[arg-type]
        assert patches() == []  # never registered: nothing
        await player.sync(client, "dgx-h100-0", view(), [pod()])  # type: ignore[arg-type]
        await player.sync(client, "dgx-h100-0", view(), [pod()])  # type: ignore[arg-type]
        assert patches() == [{"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}]
        assert client.calls[0][1][2] == {"field_manager": "kubelet"}
        now[0] = 110.0
        again = await player.sync(client, "dgx-h100-0", view(), [pod(terminating=True)])  # type: ignore[arg-type]
        assert again == pytest.approx(30.05)
        assert patches()[-1] == {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "0"}}
        now[0] = 141.0
        assert await player.sync(client, "dgx-h100-0", view(), []) is None  # type: ignore[arg-type]
        assert patches()[-1] == {"capacity": {"nvidia.com/gpu": "0"}, "allocatable": {"nvidia.com/gpu": "0"}}
        await player.sync(client, "dgx-h100-0", view(capacity={"nvidia.com/gpu": "8"}), [])  # type: ignore[arg-type]
        assert len(patches()) == 3

    asyncio.run(go())


def test_capacity_left_by_an_earlier_run_starts_the_grace_period() -> None:
    client = FakeClient()
    player = kubeletdp.DevicePluginCapacity(grace_period=30.0, clock=lambda: 0.0)
    asyncio.run(player.sync(client, "a10-0", view("a10", capacity={"nvidia.com/gpu": "2"}, name="a10-0"), []))  # type: ignore[arg-type]
    assert client.calls[-1][1][1] == {
        "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "0"}}
    }


def test_dra_devices_come_from_the_shape() -> None:
    devices = draplugin.devices(view())
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    attrs = devices[0]["attributes"]
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"} and attrs["cudaComputeCapability"] == {
        "version": "9.0.0"
    }
    assert attrs["driverVersion"] == {"version": "550.127.5"} and attrs["cudaDriverVersion"] == {
        "version": "12.4.0"
    }
    a10 = draplugin.devices(view("a10", name="a10-0"))
    assert len(a10) == 2 and a10[0]["attributes"]["architecture"] == {"string": "Ampere"}
    assert draplugin.devices(view("vfio-passthrough")) == []
    body = draplugin.slice_for(view())
    assert (
        body["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
        and body["spec"]["nodeName"] == "dgx-h100-0"
    )


def feature(ns: str, name: str, labels: dict[str, str], node: str = "n1") -> nfdmaster.FeatureView:
    return nfdmaster.FeatureView(ns, name, node, tuple(sorted(labels.items())))


def test_nfd_master_merges_in_its_order_and_filters() -> None:
    merged = nfdmaster.merged_labels(
        [
            feature("gpu-operator", "nvidia-features-for-n1", {"nvidia.com/gpu.count": "8", "x": "gfd"}),
            feature("node-feature-discovery", "n1", {"x": "worker", "pci-10de.present": "true"}),
        ]
    )
    assert merged == {
        "nvidia.com/gpu.count": "8",
        "feature.node.kubernetes.io/x": "gfd",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    assert nfdmaster.allowed("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
    assert nfdmaster.allowed("feature.node.kubernetes.io/x", "1")
    assert nfdmaster.allowed("sub.feature.node.kubernetes.io/x", "1")
    assert not nfdmaster.allowed("kubernetes.io/hostname", "x")
    assert not nfdmaster.allowed("node-role.kubernetes.io/x", "")
    assert not nfdmaster.allowed("nvidia.com/x", "not a value")


def test_nfd_master_patch_adds_replaces_removes_and_records_its_keys() -> None:
    wanted = {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "H100",
        "feature.node.kubernetes.io/y": "1",
    }
    ops = nfdmaster.node_patch({"nvidia.com/gpu.count": "4", "other": "x"}, {"a": "b"}, wanted, False)
    assert {"op": "replace", "path": "/metadata/labels/nvidia.com~1gpu.count", "value": "8"} in ops
    assert {"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.product", "value": "H100"} in ops
    assert {
        "op": "add",
        "path": "/metadata/annotations/nfd.node.kubernetes.io~1feature-labels",
        "value": "nvidia.com/gpu.count,nvidia.com/gpu.product,y",
    } in ops
    recorded = {"nfd.node.kubernetes.io/feature-labels": "nvidia.com/gpu.count,y"}
    gone = nfdmaster.node_patch(
        {"nvidia.com/gpu.count": "8", "feature.node.kubernetes.io/y": "1", "other": "x"}, recorded, {}, False
    )
    assert gone == [
        {"op": "remove", "path": "/metadata/labels/feature.node.kubernetes.io~1y"},
        {"op": "remove", "path": "/metadata/labels/nvidia.com~1gpu.count"},
        {"op": "remove", "path": "/metadata/annotations/nfd.node.kubernetes.io~1feature-labels"},
    ]
    assert nfdmaster.node_patch({"nvidia.com/gpu.count": "8"}, recorded, {}, True) == []


def test_work_queue_coalesces_and_retries() -> None:
    calls: list[str] = []

    async def go() -> None:
        failed: set[str] = set()

        async def handler(key: str) -> None:
            calls.append(key)
            if key == "bad" and key not in failed:
                failed.add(key)
                raise RuntimeError("once")

        queue = WorkQueue(handler, 2, "test")
        for key in ("a", "a", "b", "bad"):
            queue.add(key)
        tasks = queue.tasks()
        for _ in range(100):
            if calls.count("bad") == 2:
                break
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    assert calls.count("a") == 1 and calls.count("b") == 1 and calls.count("bad") == 2


class NoDraApi(FakeClient):
    """An apiserver without resource.k8s.io/v1 (the Kubernetes floor, 1.29)."""

    def list(self, resource: Any, **_: Any) -> Any:
        async def gen() -> Any:
            raise ApiError(
                status=type("S", (), {"code": 404, "message": "the server could not find the resource"})()
            )
            yield  # an async generator

        return gen()


def test_without_resourceslices_the_dra_stand_in_stays_idle_and_the_others_play_on() -> None:
    client = NoDraApi()
    player = draplugin.SlicePublisher()
    asyncio.run(player.start(client))  # type: ignore[arg-type]
    assert not player.served
    assert asyncio.run(player.sync(client, "dgx-h100-0", view(), [pod()])) is None  # type: ignore[arg-type]
    assert client.calls == []


class Listed:
    """A list answer: the objects (after `delay` seconds) and its resourceVersion."""

    def __init__(self, items: list[Any], delay: float = 0.0) -> None:
        self.items, self.delay, self.resourceVersion = items, delay, "1"

    async def __aiter__(self) -> Any:
        await asyncio.sleep(self.delay)
        for item in self.items:
            yield item


class SlicesLeft(FakeClient):
    """An apiserver holding a slice the DRA stand-in published before it restarted, for a node whose
    plugin pod is gone meanwhile; its pods listed after a while."""

    def __init__(self, pods: list[Any]) -> None:
        super().__init__()
        self.pods = pods

    def list(self, resource: Any, **_: Any) -> Any:
        if resource is draplugin.ResourceSlice:
            return Listed(
                [
                    draplugin.ResourceSlice.from_dict(
                        {"metadata": {"name": f"gone-{draplugin.DRIVER}"}, "spec": {"nodeName": "gone"}}
                    )
                ]
            )
        return Listed(self.pods, delay=0.1)

    async def watch(self, *_: Any, **__: Any) -> Any:
        await asyncio.Event().wait()
        yield None  # an async generator

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Node

        self.calls.append(("get", name))
        return Node(
            metadata=ObjectMeta(
                name=name,
                uid=f"uid-{name}",
                labels={shapes.SHAPE_LABEL: "dgx-h100"},
                annotations={KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
            )
        )

    async def create(self, obj: Any, field_manager: str | None = None) -> None:
        await self.apply(obj, field_manager)  # the plugin creates (a fake never says it exists)

    async def apply(self, obj: Any, field_manager: str | None = None, force: bool = False) -> None:
        self.calls.append(("apply", obj.to_dict()["spec"]["nodeName"]))

    async def delete(self, resource: Any, name: str, namespace: str | None = None) -> None:
        self.calls.append(("delete", name))


def test_a_slice_left_from_before_a_restart_is_withdrawn_once_the_pods_are_listed() -> None:
    from lightkube.models.core_v1 import Container, PodSpec, PodStatus
    from lightkube.models.meta_v1 import ObjectMeta

    def plugin_pod(node: str) -> Pod:
        return Pod(
            metadata=ObjectMeta(
                name=f"plugin-{node}",
                namespace="gpu-operator",
                uid=f"pod-{node}",
                labels={"app": draplugin.PLUGIN_APP},
            ),
            spec=PodSpec(nodeName=node, containers=[Container(name="gpus")]),
            status=PodStatus(phase="Running"),
        )

    async def go(slice_node_has_pod: bool) -> list[tuple[str, Any]]:
        client = SlicesLeft([plugin_pod("gone" if slice_node_has_pod else "other")])
        standins = NodeStandIns(client, [draplugin.SlicePublisher()])  # type: ignore[arg-type]
        task = asyncio.create_task(standins.run())
        await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return [c for c in client.calls if c[0] != "get"]

    # its pod gone: withdrawn; the other node's plugin publishes
    assert sorted(asyncio.run(go(False))) == [("apply", "other"), ("delete", f"gone-{draplugin.DRIVER}")]
    # its pod still runs: looked at with the pod known, so published again, never withdrawn first
    assert asyncio.run(go(True)) == [("apply", "gone")]
