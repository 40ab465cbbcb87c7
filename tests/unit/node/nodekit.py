"""Shared helpers for the node tests: fixture names, a validation context over a fixture host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_operator.node.host.hostfs import HostFS
from gpu_operator.node.host.runner import HostRunner
from gpu_operator.node.validate.base import Context, PodOutcome
from gpu_operator.node.validate.config import ValidatorConfig

HOSTS_DIR = Path(__file__).parents[2] / "fixtures" / "hosts"
HOST_NAMES = sorted(p.stem for p in HOSTS_DIR.glob("*.yaml"))


class FakeClock:
    """Time that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeNodeView:
    """A NodeView with canned answers; records the pods it was asked to run."""

    def __init__(
        self,
        labels: dict[str, str] | None = None,
        allocatable: dict[str, str] | None = None,
        outcome: PodOutcome | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        self.labels = labels or {}
        self.annotations = annotations or {}
        self.allocatable = allocatable or {}
        self.outcome = outcome or PodOutcome(True, "Succeeded")
        self.pods: list[dict[str, Any]] = []

    def node_labels(self) -> dict[str, str]:
        return self.labels

    def node_annotations(self) -> dict[str, str]:
        return self.annotations

    def node_allocatable(self) -> dict[str, str]:
        return self.allocatable

    def run_pod(self, manifest: dict[str, Any], timeout: float) -> PodOutcome:
        self.pods.append(manifest)
        return self.outcome

    def validator_pod_template(self) -> dict[str, Any]:
        return {
            "tolerations": [{"operator": "Exists"}],
            "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-operator-validator"}],
        }


def context(fs: HostFS, env: dict[str, str] | None = None, kube: Any = None) -> tuple[Context, FakeClock]:
    clock = FakeClock()
    config = ValidatorConfig.from_env(env or {})
    return Context(fs, HostRunner(fs, chroot=False), config, kube=kube, sleep=clock.sleep, clock=clock), clock


class RecordedNode:
    """The Node as the agent sees it: a merge patch changes labels/annotations (None deletes), events pile up."""

    def __init__(
        self, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
    ) -> None:
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self.events: list[dict[str, str]] = []
        self.patches = 0

    def node_metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.labels), dict(self.annotations)

    def publish(
        self,
        labels: dict[str, str | None],
        events: list[dict[str, str]],
        annotations: dict[str, str | None] | None = None,
    ) -> None:
        self.patches += 1
        for target, changes in ((self.labels, labels), (self.annotations, annotations or {})):
            for key, value in changes.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        self.events += events
