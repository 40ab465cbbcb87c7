"""Each stand-in calls as its component (sim/standins/identity.py): the table in sim/standins/roster.py names, for
every player `sim up` runs, who its calls go out as and which pod must be on the node; the players
say the same, docs/simulator.md shows the same table, and a player that declares no identity is
refused. The client a player is handed follows its identity; a refused call is recorded by field."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from lightkube import KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from gpu_operator.sim.plane.planeargs import hold_initializing
from gpu_operator.sim.standins import identity, roster
from gpu_operator.sim.standins.podwatch import NodeStandIns, PodView
from gpu_operator.sim.standins.vgpustandin import INIT, held_status

DOCS = Path(__file__).resolve().parents[3] / "docs" / "simulator.md"


def kubeconfig() -> KubeConfig:
    return KubeConfig.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "x"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }
    )


def every_player(tmp_path: Path) -> list[Any]:
    return roster.all_players(kubeconfig(), nodes=True, hosts=tmp_path / "hosts", agents=True)


def qualified(player: Any) -> str:
    return f"{type(player).__module__.rsplit('.', 1)[-1]}.{type(player).__name__}"


def test_every_player_is_in_the_table_with_its_identity_and_pod(tmp_path: Path) -> None:
    rows = {row.player: row for row in roster.table()}
    seen: dict[str, set[str]] = {}
    for player in every_player(tmp_path):
        row = rows.get(qualified(player))
        assert row is not None, (
            f"{qualified(player)} (app={player.app}) is not in sim/standins/roster.py's table()"
        )
        # declared by the player itself, not inherited by accident from nothing
        assert getattr(player, "identity", None) in (identity.POD, identity.KUBELET, identity.NO_API), (
            qualified(player)
        )
        assert player.identity == row.identity, (qualified(player), player.identity, row.identity)
        assert getattr(player, "pod_label", "app") == row.label, qualified(player)
        assert player.app in row.apps, (qualified(player), player.app, row.apps)
        seen.setdefault(row.player, set()).add(player.app)
    # and every row is a player `sim up` runs, each of its pods' apps played
    assert {name: set(row.apps) for name, row in rows.items()} == seen


def test_the_docs_table_is_the_modules() -> None:
    lines = DOCS.read_text().splitlines()
    start = lines.index(roster.markdown_table()[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    assert lines[start:end] == roster.markdown_table()


class NoIdentity:
    app = "nameless"
    field_manager = "x"

    async def start(self, client: Any) -> None:
        return None

    async def sync(self, client: Any, node: str, view: Any, pods: list[PodView]) -> None:
        return None


class FakeIdentities:
    """Records which identity each client stands for."""

    def __init__(self, gone: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.gone = gone

    async def for_pod(self, pod: PodView, field_manager: str) -> str:
        if pod.uid in self.gone:
            raise ApiError(status=_status(404))
        return f"sa:{pod.namespace}:{pod.service_account}:{pod.name}"

    def kubelet_lazy(self, node: str, field_manager: str) -> str:
        return f"kubelet:{node}"

    def forget(self, uid: str) -> None:
        return None


def _status(code: int) -> Any:
    from lightkube.models.meta_v1 import Status

    return Status(code=code, message=f"status {code}")


def pod(name: str, running: bool = True, started: int = 1, uid: str = "", account: str = "sa") -> PodView:
    return PodView(
        namespace="ns",
        name=name,
        uid=uid or name,
        app="gpu-feature-discovery",
        node="n1",
        running=running,
        started=started,
        service_account=account,
    )


def test_the_client_follows_the_players_identity() -> None:
    from gpu_operator.sim.standins.gfd import FeatureDiscovery
    from gpu_operator.sim.standins.toolkitconfig import ToolkitStandIn

    async def main() -> None:
        gfd, toolkit = (
            FeatureDiscovery(),
            ToolkitStandIn("nvidia-container-toolkit-daemonset", Path("/nonexistent")),
        )
        standins_ = NodeStandIns(None, [gfd, toolkit], identities=FakeIdentities({"gone"}))  # type: ignore[arg-type]
        # the newest running pod's ServiceAccount, not an older or a stopped one
        got = await standins_.client_for(
            gfd,
            "n1",
            [pod("old", started=1), pod("new", started=5), pod("stopped", running=False, started=9)],
        )
        assert got == "sa:ns:sa:new"
        # none running: the newest still there (a terminating pod's token is still good)
        assert await standins_.client_for(gfd, "n1", [pod("stopping", running=False)]) == "sa:ns:sa:stopping"
        # no pod, or its token can no longer be had: the kubelet, which cleans up after it
        assert await standins_.client_for(gfd, "n1", []) == "kubelet:n1"
        assert await standins_.client_for(gfd, "n1", [pod("gone", running=False)]) == "kubelet:n1"
        # a player that makes no API call gets no client
        none = await standins_.client_for(toolkit, "n1", [pod("t")])
        with pytest.raises(RuntimeError) as err:
            none.get(Node, "n1")
        assert "no API calls" in str(err.value)
        # a player that declares none is refused, by name
        with pytest.raises(TypeError) as refused:
            await standins_.client_for(NoIdentity(), "n1", [pod("x")])
        assert "NoIdentity" in str(refused.value)

    asyncio.run(main())


def test_a_refused_call_is_recorded_with_identity_verb_and_resource(caplog: pytest.LogCaptureFixture) -> None:
    class Inner:
        async def patch(self, *args: Any, **kwargs: Any) -> None:
            raise ApiError(status=_status(403))

        async def get(self, *args: Any, **kwargs: Any) -> str:
            return "fine"

    refusals = identity.Refusals()
    client = identity.GuardedAsyncClient(Inner(), "system:serviceaccount:ns:gfd", refusals)

    async def main() -> None:
        assert await client.get(Node, "n1") == "fine"
        for _ in range(2):  # retried: recorded each time, logged once
            with pytest.raises(ApiError) as err:
                await client.patch(Node.Status, "n1", {"status": {}})
            assert err.value.status.code == 403  # raised as it came: the work queue backs off

    with caplog.at_level(logging.WARNING, logger="gpu_operator.sim.standins"):
        asyncio.run(main())
    assert [(r.identity, r.verb, r.resource, r.name) for r in refusals.seen] == [
        ("system:serviceaccount:ns:gfd", "patch", "nodes/status", "n1")
    ] * 2
    records = [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith("{")]
    assert [(r["event"], r["identity"], r["verb"], r["resource"]) for r in records] == [
        ("refused", "system:serviceaccount:ns:gfd", "patch", "nodes/status")
    ]


def test_the_held_pod_status_is_the_kubelets() -> None:
    from lightkube.resources.core_v1 import Pod

    spec = Pod.from_dict(
        {
            "metadata": {"name": "v", "namespace": "ns", "uid": "u1"},
            "spec": {
                "initContainers": [
                    {"name": "cc-manager-validation", "image": "i"},
                    {"name": INIT, "image": "i"},
                    {"name": "vgpu-manager-validation", "image": "i"},
                ],
                "containers": [{"name": "nvidia-sandbox-validator", "image": "i"}],
            },
        }
    )
    failed = held_status(spec, True, 2)
    assert failed["phase"] == "Pending"
    conditions = {c["type"]: (c["status"], c["reason"]) for c in failed["conditions"]}
    assert conditions == {
        "Initialized": ("False", "ContainersNotInitialized"),
        "Ready": ("False", "ContainersNotReady"),
        "ContainersReady": ("False", "ContainersNotReady"),
    }
    states = {s["name"]: s for s in failed["initContainerStatuses"]}
    assert states["cc-manager-validation"]["state"]["terminated"]["reason"] == "Completed"
    assert states[INIT]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert states[INIT]["lastState"]["terminated"]["exitCode"] == 1 and states[INIT]["restartCount"] == 2
    assert states["vgpu-manager-validation"]["state"]["waiting"]["reason"] == "PodInitializing"
    assert [s["state"]["waiting"]["reason"] for s in failed["containerStatuses"]] == ["PodInitializing"]
    waiting = {s["name"]: s for s in held_status(spec, False, 0)["initContainerStatuses"]}
    assert "running" in waiting[INIT]["state"] and waiting[INIT]["ready"] is False


def test_kwok_leaves_a_pod_held_in_its_init_containers_alone() -> None:
    import yaml

    stages = yaml.safe_dump(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "pod-ready"},
            "spec": {"selector": {"matchExpressions": []}, "next": {}},
        }
    )
    other = yaml.safe_dump({"kind": "Stage", "metadata": {"name": "pod-delete"}, "spec": {"selector": {}}})
    docs = list(yaml.safe_load_all(hold_initializing(stages + "---\n" + other)))
    ready = next(d for d in docs if d["metadata"]["name"] == "pod-ready")
    assert ready["spec"]["selector"]["matchExpressions"] == [
        {
            "key": '.status.conditions.[] | select( .type == "Initialized" ) | .status',
            "operator": "NotIn",
            "values": ["False"],
        }
    ]
    assert next(d for d in docs if d["metadata"]["name"] == "pod-delete")["spec"] == {"selector": {}}
