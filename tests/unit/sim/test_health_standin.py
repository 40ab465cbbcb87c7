"""The health agent's stand-in on kwok nodes (`sim/standins/health.py`), in-process with a recording client:
it acts only where the validator pod runs with its gpu-health container, publishes the agent's
report once per change through the agent's publisher, follows `sim fault` (an Xid, a GPU off the
bus, a reboot), carries out remediation's reset and reboot requests on the node's tree, and
leaves quiet nodes alone: 1,000 of them cost one patch each and nothing after.
The kwok device plugin's stand-in follows the same trees: Unhealthy GPUs leave allocatable."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import shapes
from gpu_operator.api.health import HealthReport
from gpu_operator.controllers.units.health.machine import request_text
from gpu_operator.sim.hardware.faults import NodeHosts, node_host_spec
from gpu_operator.sim.standins import kubeletdp
from gpu_operator.sim.standins.health import APP, CONTAINER, HealthStandIn
from gpu_operator.sim.standins.podwatch import PodView, StandinNodeView
from gpu_operator.vocabulary import (
    HEALTH_REPORT_ANNOTATION,
    HEALTH_REQUESTS_SECRET,
    HEALTH_SINCE_ANNOTATION,
    HEALTH_STATE,
)


class RecordingClient:
    """The node agents' sync client, as the agent's publisher calls it: Node patches recorded."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.notes: dict[str, dict[str, str]] = {}  # node -> its annotations (merge patches applied)
        self.labels: dict[str, dict[str, str]] = {}  # node -> its labels
        self.requests: dict[str, str] = {}  # node -> its entry in the operator's requests Secret
        self.secret_reads: list[tuple[str, str | None]] = []

    def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> None:
        self.patches.append((name, body))
        notes = self.notes.setdefault(name, {})
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        """The async client's reads of the Node and the requests Secret (remediation's requests)."""
        import base64

        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Node, Secret

        if resource is Secret:
            self.secret_reads.append((name, namespace))
            data = {n: base64.b64encode(t.encode()).decode() for n, t in self.requests.items()}
            return Secret(metadata=ObjectMeta(name=name, namespace=namespace), data=data)
        return Node(
            metadata=ObjectMeta(
                name=name, labels=dict(self.labels.get(name, {})), annotations=dict(self.notes.get(name, {}))
            )
        )

    def ask(self, node: str, action: str, gpus: list[str], since: str) -> None:
        """The operator's request: the Node in validating since `since`, its entry in the Secret."""
        self.labels[node] = {HEALTH_STATE: "validating"}
        self.notes.setdefault(node, {})[HEALTH_SINCE_ANNOTATION] = since
        self.requests[node] = request_text(node, action, gpus, 0, since)

    def reports(self, node: str) -> list[dict[str, Any]]:
        return [
            json.loads(b["metadata"]["annotations"][HEALTH_REPORT_ANNOTATION])
            for n, b in self.patches
            if n == node
        ]


def pod(
    node: str,
    uid: str = "uid-1",
    running: bool = True,
    containers: tuple[str, ...] = ("nvidia-operator-validator", CONTAINER),
    env: dict[str, str] | None = None,
) -> PodView:
    return PodView(
        "gpu-operator",
        f"nvidia-operator-validator-{node}",
        uid,
        APP,
        node,
        running,
        0,
        None,
        env or {},
        containers,
    )


def view(node: str, shape: str = "dgx-h100") -> StandinNodeView:
    return StandinNodeView(node, f"uid-{node}", {}, {}, shapes.load(shape))


class Harness:
    def __init__(self, base: Path) -> None:
        self.client = RecordingClient()
        self.standin = HealthStandIn(None, base / "hosts", interval=0.05, client=self.client)
        self.hosts = NodeHosts(base / "hosts")
        self.woken: list[str] = []
        self.standin.attach(self.woken.append)

    async def sync(self, node: str, *pods: PodView, shape: str = "dgx-h100") -> float | None:
        return await self.standin.sync(self.client, node, view(node, shape), list(pods))  # type: ignore[arg-type]

    def fault(self, node: str) -> Any:
        faults = self.hosts.faults(node, node_host_spec("dgx-h100"))
        return faults


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_only_where_the_validator_pod_runs_its_health_container(harness: Harness) -> None:
    async def go() -> None:
        await harness.standin.start(None)  # type: ignore[arg-type]
        await harness.sync("a", pod("a", running=False))
        await harness.sync(
            "b", pod("b", containers=("nvidia-operator-validator",))
        )  # no gpu-health container
        assert harness.client.patches == []
        assert await harness.sync("c", pod("c")) is None  # a quiet node: no further step asked for
        (report,) = harness.client.reports("c")
        assert (report["state"], report["action"], report["healthy"], report["validated"]) == (
            "healthy",
            "none",
            8,
            True,
        )
        assert await harness.sync("c", pod("c")) is None  # the same pod again: no patch
        assert len(harness.client.patches) == 1
        # the container's HEALTH_VALIDATIONS is the agent's: a node without the plugin check
        await harness.sync("d", pod("d", env={"HEALTH_VALIDATIONS": "driver,toolkit"}))
        assert harness.client.reports("d")[0]["validated"] is True

    run(go())


def test_an_xid_then_a_lost_gpu_then_a_reboot(harness: Harness) -> None:
    async def go() -> None:
        standin = harness.standin
        await standin.start(None)  # type: ignore[arg-type]
        await harness.sync("n", pod("n"))
        faults = harness.fault("n")
        lost = faults.xid(79, 1)
        harness.hosts.announce("n")
        await asyncio.sleep(0.2)
        assert harness.woken == ["n"]
        assert await harness.sync("n", pod("n")) == standin.interval  # a fault: stepped on its interval
        report = harness.client.reports("n")[-1]
        assert (report["state"], report["action"], report["healthy"]) == ("unhealthy", "reboot", 7)
        (gpu,) = report["gpus"]
        assert (gpu["bus"], gpu["xid"], gpu["state"], gpu["action"]) == (
            lost.address,
            79,
            "unhealthy",
            "reboot",
        )
        assert await harness.sync("n", pod("n")) == standin.interval
        assert len(harness.client.reports("n")) == 2  # unchanged: no patch

        gone = faults.gone(2)
        await harness.sync("n", pod("n"))
        report = harness.client.reports("n")[-1]
        assert report["state"] == "gone"
        assert {g["bus"]: g["state"] for g in report["gpus"]} == {
            lost.address: "unhealthy",
            gone.address: "gone",
        }

        faults.clear()  # a reboot: the pod restarts with the node, a new agent
        assert await harness.sync("n", pod("n")) is None  # healthy again and quiet
        report = harness.client.reports("n")[-1]
        assert (report["state"], report["action"], report["healthy"], report["gpus"]) == (
            "healthy",
            "none",
            8,
            [],
        )
        assert standin.live == {}
        assert len(harness.client.reports("n")) == 4  # first look, Xid, gone, rebooted

    run(go())


def test_remediation_requests_reset_a_gpu_on_the_tree_and_a_reboot_leaves_the_sentinel(
    harness: Harness,
) -> None:
    async def go() -> None:
        standin, client = harness.standin, harness.client
        await standin.start(None)  # type: ignore[arg-type]
        await harness.sync("r", pod("r"))
        faults = harness.fault("r")
        bad = faults.xid(48, 3)
        gone = faults.gone(5)
        await harness.sync("r", pod("r"))
        assert {g["bus"]: g["state"] for g in client.reports("r")[-1]["gpus"]} == {
            bad.address: "unhealthy",
            gone.address: "gone",
        }
        # the operator asks for both GPUs to be reset: the one on the bus is, the gone one is refused
        # a Node annotation asks nothing
        client.notes["r"]["nvidia.com/gpu-health.reset-requested"] = bad.address
        await harness.sync("r", pod("r"))
        assert "reset" not in client.reports("r")[-1]
        client.ask("r", "reset-gpu", [bad.address, gone.address], "100")
        await harness.sync("r", pod("r"))
        assert client.secret_reads[-1] == (HEALTH_REQUESTS_SECRET, "gpu-operator")
        report = HealthReport.parse(json.dumps(client.reports("r")[-1]))
        assert report.reset_outcome(bad.address) == ("done", "")
        assert report.reset_outcome(gone.address) == (
            "refused",
            "gone from the bus (only a reboot brings it back)",
        )
        assert [(g.bus, g.state) for g in report.gpus] == [(gone.address, "gone")]  # reset: healthy again
        assert [x["gpu"] for x in json.loads((faults.book_path).read_text())["xids"]] == [
            5
        ]  # the gone GPU's stays
        assert report.answered is None  # not every GPU asked for is reset
        # then a reboot: the sentinel in the tree, the request answered in the report
        client.ask("r", "reboot", [], "200")
        await harness.sync("r", pod("r"))
        await harness.sync("r", pod("r"))
        assert faults.fs.is_file("/var/run/reboot-required")
        assert HealthReport.parse(json.dumps(client.reports("r")[-1])).answered == "reboot:0:200"
        assert all(set(b["metadata"]["annotations"]) == {HEALTH_REPORT_ANNOTATION} for _, b in client.patches)
        faults.clear()  # the reboot (kured's part, played by hand): the sentinel goes with /run
        await harness.sync("r", pod("r"))
        # the new boot's agent sees the request not withdrawn yet: the reboot took place, no new sentinel
        assert not faults.fs.exists("/var/run/reboot-required")
        assert client.reports("r")[-1]["gpus"] == [] and client.reports("r")[-1]["answered"] == "reboot:0:200"

    run(go())


def test_a_gpu_lost_on_a_quiet_node_is_gone_as_for_an_agent_that_ran_all_along(harness: Harness) -> None:
    async def go() -> None:
        await harness.standin.start(None)  # type: ignore[arg-type]
        await harness.sync("q", pod("q"))
        gone = harness.fault("q").gone(0)  # the node's first fault: its own tree is made now
        await harness.sync("q", pod("q"))
        report = harness.client.reports("q")[-1]
        assert report["state"] == "gone" and [g["bus"] for g in report["gpus"]] == [gone.address]

    run(go())


def test_a_tree_made_at_a_fault_carries_what_the_running_validator_wrote_at_its_start(
    harness: Harness,
) -> None:
    """The node's own tree is born with no validator status file (none may have run); the agent of
    the validator pod that ran all along finds the files its init containers wrote at the pod's
    start, with that time, and stays validated; a tree made while no validator ran stays without."""
    from gpu_operator.vocabulary import VALIDATIONS_DIR

    async def go() -> None:
        await harness.standin.start(None)  # type: ignore[arg-type]
        started = dataclasses.replace(pod("v"), started=1_700_000_000)
        await harness.sync("v", started)
        faults = harness.fault("v")
        assert not faults.fs.exists(f"{VALIDATIONS_DIR}/driver-ready")  # born without
        faults.xid(79, 0)
        await harness.sync("v", started)
        report = harness.client.reports("v")[-1]
        assert report["validated"] is True and report["state"] != "healthy"
        assert faults.fs.resolve(f"{VALIDATIONS_DIR}/driver-ready").stat().st_mtime == 1_700_000_000
        quiet = harness.fault("w")  # no validator pod on w: nothing wrote there
        quiet.xid(79, 0)
        await harness.sync("w")
        assert not quiet.fs.exists(f"{VALIDATIONS_DIR}/driver-ready") and harness.client.reports("w") == []

    run(go())


def test_a_validator_pod_started_again_after_a_gpu_left_the_bus_still_reports_it_gone(
    harness: Harness,
) -> None:
    """The GPUs the first agent of this boot found are on the node's own tree once it is made
    (node/health/inventory.py): the next pod's agent, on the same boot, knows the one that went."""

    async def go() -> None:
        await harness.standin.start(None)  # type: ignore[arg-type]
        await harness.sync("g", pod("g"))
        gone = harness.fault("g").gone(0)  # the node's own tree is made now, the GPU taken out of it
        await harness.sync("g", pod("g"))
        await harness.sync("g", pod("g", uid="uid-2"))  # a new validator pod, the same boot
        report = harness.client.reports("g")[-1]
        assert report["state"] == "gone" and [g["bus"] for g in report["gpus"]] == [gone.address]

    run(go())


def test_the_pod_going_publishes_the_agents_last_report(harness: Harness) -> None:
    async def go() -> None:
        await harness.standin.start(None)  # type: ignore[arg-type]
        await harness.sync("s", pod("s"))
        await harness.sync("s", pod("s", running=False))
        last = harness.client.reports("s")[-1]
        assert last["stopped"] is True and last["state"] == "healthy"

    run(go())


def test_a_new_validator_pod_runs_a_new_agent_even_when_the_old_pods_end_was_not_seen(
    harness: Harness,
) -> None:
    async def go() -> None:
        standin = harness.standin
        await standin.start(None)  # type: ignore[arg-type]
        await harness.sync("p", pod("p"))
        harness.fault("p").xid(48, 3)
        assert await harness.sync("p", pod("p")) == standin.interval
        old = standin.live["p"].agent
        # the pod replaced, seen in one sync (the work queue coalesced its end and its successor)
        assert await harness.sync("p", pod("p", uid="uid-2")) == standin.interval
        assert standin.live["p"].agent is not old and standin.pods["p"] == "uid-2"
        # as the pod's agent (no replay): the new one reads the kernel log from its end, the old one's
        # Xid 48 is not its
        assert [r["state"] for r in harness.client.reports("p")] == ["healthy", "unhealthy", "healthy"]

    run(go())


def test_a_thousand_quiet_nodes_cost_one_patch_each_and_nothing_after(harness: Harness) -> None:
    async def go() -> None:
        standin = harness.standin
        await standin.start(None)  # type: ignore[arg-type]
        names = [f"gpu-{i}" for i in range(1000)]
        for name in names:
            assert await harness.sync(name, pod(name, uid=f"uid-{name}")) is None
        assert len(harness.client.patches) == 1000 and standin.live == {}
        harness.fault("gpu-7").xid(48, 0)
        harness.hosts.announce("gpu-7")
        await asyncio.sleep(0.2)
        assert harness.woken == ["gpu-7"]  # only the node whose host changed
        await harness.sync("gpu-7", pod("gpu-7", uid="uid-gpu-7"))
        assert list(standin.live) == ["gpu-7"]
        assert [n for n, _ in harness.client.patches[1000:]] == ["gpu-7"]
        assert harness.client.reports("gpu-7")[-1]["action"] == "reset-gpu"

    run(go())


class StatusClient:
    """The device plugin stand-in's async client: Node status patches recorded."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []

    async def patch(self, resource: Any, name: str, body: dict[str, Any], **_: Any) -> None:
        self.statuses.append(body["status"])


def test_on_kwok_nodes_the_device_plugin_counts_unhealthy_gpus_out_of_allocatable(tmp_path: Path) -> None:
    hosts = NodeHosts(tmp_path / "hosts")
    client = StatusClient()
    player = kubeletdp.DevicePluginCapacity(hosts=tmp_path / "hosts", interval=0.05)
    woken: list[str] = []
    player.attach(woken.append)

    def plugin(uid: str = "dp-1", env: dict[str, str] | None = None) -> PodView:
        return PodView(
            "gpu-operator",
            "nvidia-device-plugin-daemonset-x",
            uid,
            kubeletdp.APP,
            "n",
            True,
            0,
            None,
            env or {},
            ("nvidia-device-plugin",),
        )

    def allocatable() -> tuple[str, str]:
        last = client.statuses[-1]
        return last["capacity"]["nvidia.com/gpu"], last["allocatable"]["nvidia.com/gpu"]

    async def go() -> None:
        await player.start(None)  # type: ignore[arg-type]
        sync: Any = player.sync
        await sync(client, "n", view("n"), [plugin()])
        assert allocatable() == ("8", "8")
        faults = hosts.faults("n", node_host_spec("dgx-h100"))
        faults.xid(13, 0)  # an application Xid: NVIDIA's plugin ignores it
        hosts.announce("n")
        await asyncio.sleep(0.2)
        assert woken == ["n"]
        await sync(client, "n", view("n"), [plugin()])
        assert len(client.statuses) == 1  # nothing to write
        faults.xid(79, 3)
        faults.gone(5)
        await sync(client, "n", view("n"), [plugin()])
        assert allocatable() == ("8", "6")
        await sync(
            client, "n", view("n"), [plugin(uid="dp-2")]
        )  # a new plugin pod: Xids before it are not its
        assert allocatable() == ("8", "7")  # the lost GPU stays Unhealthy
        faults.clear()  # a reboot
        await sync(client, "n", view("n"), [plugin(uid="dp-2")])
        assert allocatable() == ("8", "8")
        faults.xid(48, 0)
        await sync(client, "n", view("n"), [plugin(uid="dp-2", env={"DP_DISABLE_HEALTHCHECKS": "all"})])
        assert allocatable() == ("8", "7")  # the same process: its environment is the one it started with

    run(go())
