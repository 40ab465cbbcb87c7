"""The other side of the health agent's remediation requests: the request watch (the agent's Node
and its entry in the requests Secret, watched again after a failure), the command that wires the
agent to it, and the operator reading (or refusing) each reset outcome in the report."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.health import HealthReport
from gpu_operator.node.health import HealthAgent, encode
from gpu_operator.node.health.requests import SENTINEL, RequestActor, Seen
from gpu_operator.vocabulary import HEALTH_SINCE_ANNOTATION, HEALTH_STATE
from tests.unit.node.health.healthkit import BUS, asked


@pytest.mark.parametrize("text", ["done", "refused:held by pid 7 (x)", "failed:exit 1"])
def test_the_operator_reads_each_outcome(text: str) -> None:
    report = HealthReport.parse(
        encode(
            {
                "v": 1,
                "validated": True,
                "state": "healthy",
                "action": "none",
                "healthy": 8,
                "gpus": [],
                "sources": ["pci"],
                "reset": {BUS: text},
            }
        )
    )
    assert report.reset_outcome(BUS) == tuple(text.partition(":")[::2])


def test_the_request_watch_keeps_the_node_and_its_entry_and_watches_again_after_a_failure() -> None:
    import base64
    import threading

    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Node, Secret

    from gpu_operator.node.cluster.kubeapi import RequestWatch
    from gpu_operator.vocabulary import HEALTH_REQUESTS_SECRET

    done = threading.Event()
    entry = asked().request or ""

    class Client:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str | None, dict[str, str]]] = []

        def watch(self, resource: Any, fields: dict[str, str], namespace: str | None = None) -> Any:
            self.calls.append((resource.__name__, namespace, fields))
            if resource is Node:
                if sum(c[0] == "Node" for c in self.calls) == 1:
                    yield (
                        "ADDED",
                        Node(
                            metadata=ObjectMeta(
                                name="node-a",
                                labels={HEALTH_STATE: "validating"},
                                annotations={HEALTH_SINCE_ANNOTATION: "1"},
                            )
                        ),
                    )
                    raise ConnectionError("apiserver away")
                yield (
                    "MODIFIED",
                    Node(
                        metadata=ObjectMeta(
                            name="node-a",
                            labels={HEALTH_STATE: "validating"},
                            annotations={HEALTH_SINCE_ANNOTATION: "100"},
                        )
                    ),
                )
            else:
                data = {"node-a": base64.b64encode(entry.encode()).decode(), "node-b": "e30="}
                yield "ADDED", Secret(metadata=ObjectMeta(name=HEALTH_REQUESTS_SECRET), data=data)
            done.set()
            threading.Event().wait()  # the watch stays open

    client, logs = Client(), list[str]()
    watch = RequestWatch("node-a", "gpu-operator", client, logs.append)
    for _ in range(200):
        if watch.current().annotations.get(HEALTH_SINCE_ANNOTATION) == "100" and watch.current().request:
            break
        threading.Event().wait(0.05)
    assert sorted(client.calls) == [("Node", None, {"metadata.name": "node-a"})] * 2 + [
        ("Secret", "gpu-operator", {"metadata.name": HEALTH_REQUESTS_SECRET})
    ]
    assert watch.current() == asked()
    assert logs == ["watching Node node-a failed (apiserver away); watching again"]


def test_the_operator_refuses_an_outcome_it_does_not_know_naming_the_field() -> None:
    from gpu_operator.api.health import ReportError

    base = {
        "v": 1,
        "validated": True,
        "state": "healthy",
        "action": "none",
        "healthy": 8,
        "gpus": [],
        "sources": ["pci"],
    }
    with pytest.raises(ReportError, match=rf"field reset\.{BUS}: String should match pattern"):
        HealthReport.parse(encode({**base, "reset": {BUS: "ok"}}))
    with pytest.raises(ReportError, match=r"field reset\.0000:44:00\.\[key\]: String should match pattern"):
        HealthReport.parse(
            encode({**base, "reset": {"0000:44:00": "done"}})
        )  # not a bus id as sysfs names it


def test_the_command_runs_the_agent_with_requests_and_the_request_watch(
    build_host: Any, monkeypatch: Any
) -> None:
    from typer.testing import CliRunner

    from gpu_operator.cli import app
    from gpu_operator.node.cluster import kubeapi
    from gpu_operator.node.health import agent as agent_module

    seen: dict[str, Any] = {}

    class Watch:
        def __init__(self, node: str, namespace: str, client: Any = None, log: Any = None) -> None:
            seen["watched"] = (node, namespace)

        def current(self) -> Seen:
            return Seen()

    async def fake_run(
        agent: HealthAgent, publisher: Any, interval: float, stop: Any, requests: Any = None
    ) -> None:
        seen.update(agent=agent, publisher=publisher, requests=requests)

    monkeypatch.setattr(kubeapi, "new_client", lambda: object())
    monkeypatch.setattr(kubeapi, "RequestWatch", Watch)
    monkeypatch.setattr(agent_module, "run", fake_run)
    monkeypatch.setenv("OPERATOR_NAMESPACE", "gpu-operator")
    root = build_host("h100-nvidia-bound").fs.root
    result = CliRunner().invoke(
        app,
        [
            "node",
            "health",
            "--host-root",
            str(root),
            "--node-name",
            "node-a",
            "--metrics-port",
            "0",
            "--no-nvml",
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen["watched"] == ("node-a", "gpu-operator") and isinstance(seen["requests"], Watch)
    actor = seen["agent"].requests
    assert isinstance(actor, RequestActor) and actor.sentinel == SENTINEL
