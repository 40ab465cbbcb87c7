"""psa.enabled: the operator's namespace gets the privileged Pod Security labels, written once."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gpu_operator.api.clusterpolicy import ClusterPolicy
from gpu_operator.controllers.units.clusterpolicy.podsecurity import NamespaceLabeller, namespace_labels
from gpu_operator.kube.client import Kube


def _policy(psa: dict[str, Any] | None) -> ClusterPolicy:
    spec: dict[str, Any] = {} if psa is None else {"psa": psa}
    return ClusterPolicy.model_validate(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
            "spec": spec,
        }
    )


class Patches:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, dict[str, Any]]] = []

    async def merge_patch(self, api_version: str, kind: str, name: str, patch: dict[str, Any]) -> None:
        self.sent.append((api_version, kind, name, patch))


def test_only_an_enabled_psa_asks_for_labels() -> None:
    assert namespace_labels(_policy(None)) == {}
    assert namespace_labels(_policy({"enabled": False})) == {}
    assert namespace_labels(_policy({"enabled": True})) == {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/audit": "privileged",
        "pod-security.kubernetes.io/warn": "privileged",
    }


def test_the_namespace_is_patched_once_and_only_when_asked() -> None:
    patches = Patches()
    labeller = NamespaceLabeller(cast(Kube, patches))

    async def run() -> None:
        await labeller.ensure(_policy(None), "gpu-operator")
        assert patches.sent == []  # psa off: nothing written, nothing taken away
        for _ in range(3):
            await labeller.ensure(_policy({"enabled": True}), "gpu-operator")
        await labeller.ensure(_policy({"enabled": True}), "other")

    asyncio.run(run())
    assert [(kind, name) for _, kind, name, _ in patches.sent] == [
        ("Namespace", "gpu-operator"),
        ("Namespace", "other"),
    ]
    assert patches.sent[0][3]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
