"""Reading Events in integration tests."""

from __future__ import annotations

from lightkube import Client
from lightkube.resources.core_v1 import Event


def node_events(kube: Client, node: str) -> list[Event]:
    """The Events about a Node (they live in the default namespace)."""
    return [e for e in kube.list(Event, namespace="default")
            if e.involvedObject and e.involvedObject.kind == "Node" and e.involvedObject.name == node]
