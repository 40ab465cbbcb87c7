"""Adds and removes fake GPU nodes (kwok-managed Node objects built from shapes)."""

from __future__ import annotations

import time
from typing import Any

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node, Pod

from gpu_operator import shapes


def add_nodes(client: Client, specs: list[str], start: int = 0) -> list[str]:
    """Create Nodes for `NAME[:COUNT]` specs (status included: kwok keeps capacity and nodeInfo)."""
    names: list[str] = []
    for manifest in shapes.nodes(specs, start=start):
        create_node(client, manifest)
        names.append(manifest["metadata"]["name"])
    return names


def create_node(client: Client, manifest: dict[str, Any]) -> None:
    try:
        client.create(from_dict(manifest))
    except ApiError as err:
        if err.status.code != 409:
            raise


def remove_nodes(client: Client, names: list[str]) -> None:
    """Delete nodes the way a cluster autoscaler does: their pods first, then the Node. (Left to
    itself, the pod garbage collector only removes a deleted node's pods after a 40 s quarantine.)"""
    for name in names:
        for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": name}):
            meta = pod.metadata
            assert meta is not None and meta.name is not None
            try:
                client.delete(Pod, meta.name, namespace=meta.namespace, grace_period=0)
            except ApiError as err:
                if err.status.code != 404:
                    raise
        try:
            client.delete(Node, name)
        except ApiError as err:
            if err.status.code != 404:
                raise


def node_ready(node: Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def wait_ready(client: Client, names: list[str], timeout: float = 60.0) -> None:
    """Wait until kwok reports every named node Ready; names the stragglers on timeout."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        ready = {
            n.metadata.name
            for n in client.list(Node, labels={"type": "kwok"})
            if n.metadata is not None and node_ready(n)
        }
        pending -= ready
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(pending)} fake node(s) not Ready after {timeout:.0f}s "
                f"(e.g. {sorted(pending)[:3]}): is kwok running? see its log"
            )
        time.sleep(0.3)
