"""Every test process: lightkube's types made ready before a test or a stand-in starts a thread
that decodes (src/gpu_operator/node/cluster/kubetypes.py: two threads that decode a type for the first
time at once crash the process), and a crash in a process the tests start prints every thread's
stack (PYTHONFAULTHANDLER; pytest's own faulthandler plugin does it for this process)."""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    from gpu_operator.node.cluster import kubetypes

    kubetypes.prepare()


# Side by side (`./dev test` runs the tests outside tests/unit in worker processes: pytest-xdist,
# `--dist loadfile`, with the scheduler below): each worker starts its own control plane, so tests
# of different workers share nothing in the cluster. What they would share is this machine: the
# real kubelet node (its containerd, the image it imports), the simulator's demos with a real
# node, the image builds. Every module that uses one of those runs in one worker, one after
# another, as without workers; every other module stays whole in one worker (its module fixtures
# are made once). The scheduler sees test ids only, so a module is the machine's when its source
# names one of HOST_FIXTURES (a test or a fixture of its own asks for it; or image_archive: it builds
# dist/'s image archive, which the real node's fixture builds too when stale) or it is in HOST_MODULES.
# (xdist's own `loadgroup` cannot do it with pytest 9: it rewrites a test's `_nodeid`, which
# pytest 9's `nodeid` no longer reads, so its groups never reach the scheduler.)
HOST_FIXTURES = (
    "real_node",
    "real_gpu_node",
    "real_passthrough_node",
    "device_plugin_pod",
    "registry_image",
    "image_archive",
)
HOST_MODULES = ("tests/integration/test_sim_cli.py", "tests/image/")
HOST_GROUP = "this-machine"


def work_unit(root: Path, module: str, cache: dict[str, str]) -> str:
    """The worker's unit a test module belongs to: HOST_GROUP or the module itself."""
    if module not in cache:
        try:
            source = (root / module).read_text()
        except OSError:
            source = ""
        names = set(re.findall(r"\b\w+\b", source))
        cache[module] = module  # (a module importing itself, or a loop, ends here)
        # a module whose fixtures it borrows (`from tests.integration.test_x import ...`) counts too
        borrowed = {f"{m.replace('.', '/')}.py" for m in re.findall(r"\b(tests\.\w+\.test_\w+)\b", source)}
        on_host = (
            module.startswith(HOST_MODULES)
            or any(name in names for name in HOST_FIXTURES)
            or any(work_unit(root, other, cache) == HOST_GROUP for other in borrowed - {module})
        )
        cache[module] = HOST_GROUP if on_host else module
    return cache[module]


# Longest unit first (the workers share two cores, so the run ends when the last unit does): with
# xdist's order (most tests first) the one-test 3-minute crash test went last and ran alone at the
# end. A unit's weight is the sum of its modules' seconds in the last side-by-side run that ran
# them whole (pytest's cache, written below), else ESTIMATED_SECONDS (a fresh clone has no cache),
# else SECONDS_PER_TEST for each of its tests.
SECONDS_KEY = "gpu-operator/module-seconds"
SECONDS_PER_TEST = 13.0  # the mean outside tests/unit: 3,120 s of work for 242 tests (2026-12-03)
# The modules far longer than their count of tests says (seconds on 2 cores, the run of 2026-12-03)
ESTIMATED_SECONDS = {
    "tests/chaos/test_crash_anywhere.py": 180.0,
    "tests/chaos/test_controlplane_faults.py": 215.0,
    "tests/integration/test_operator_ha_idle.py": 120.0,
    "tests/integration/test_upgrades.py": 150.0,
}


def unit_weights(units: dict[str, list[str]], known: dict[str, float]) -> dict[str, float]:
    """Each unit's expected seconds: its modules' recorded seconds, else its tests' estimate."""
    weights: dict[str, float] = {}
    for unit, nodeids in units.items():
        by_module: dict[str, int] = {}
        for nodeid in nodeids:
            module = nodeid.split("::", 1)[0]
            by_module[module] = by_module.get(module, 0) + 1
        weights[unit] = sum(
            known.get(m, ESTIMATED_SECONDS.get(m, n * SECONDS_PER_TEST)) for m, n in by_module.items()
        )
    return weights


class LongestFirst(OrderedDict):  # type: ignore[type-arg]
    """xdist's queue of units, whose `popitem(last=False)` (the next unit for a free worker) hands
    out the heaviest unit left (weighed at the first pop: the queue is filled by then)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[str, float] | None = None
        self.known: dict[str, float] = {}

    def popitem(self, last: bool = True) -> Any:
        if last:
            return super().popitem(last=True)
        if self.weights is None:
            self.weights = unit_weights({u: list(ids) for u, ids in self.items()}, self.known)
        weights = self.weights
        heaviest = max(self, key=lambda unit: weights.get(unit, 0.0))  # ties: the first queued
        return heaviest, self.pop(heaviest)


class ModuleSeconds:
    """The controller's record of each module's seconds (setup, call and teardown of its tests),
    kept in pytest's cache at the end for the modules whose every collected test reported its
    teardown (a run of some of a module's tests says nothing of the whole)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.seconds: dict[str, float] = {}
        self.finished: dict[str, int] = {}
        self.collected: dict[str, int] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration
        if report.when == "teardown":
            self.finished[module] = self.finished.get(module, 0) + 1

    def whole(self) -> dict[str, float]:
        return {
            m: round(s, 1)
            for m, s in self.seconds.items()
            if self.collected.get(m) and self.finished.get(m) == self.collected[m]
        }

    def pytest_sessionfinish(self) -> None:
        if self.cache is not None and self.whole():
            self.cache.set(SECONDS_KEY, {**self.cache.get(SECONDS_KEY, {}), **self.whole()})


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))
    units: dict[str, str] = {}
    cache = getattr(config, "cache", None)  # absent under -p no:cacheprovider
    record = ModuleSeconds(cache)
    config.pluginmanager.register(record, "gpu-operator-module-seconds")

    class ModuleOrMachine(LoadFileScheduling):  # type: ignore[misc]  # xdist ships no types
        def __init__(self, config: pytest.Config, log: Any) -> None:
            super().__init__(config, log)
            self.workqueue = LongestFirst()
            self.workqueue.known = dict(cache.get(SECONDS_KEY, {})) if cache is not None else {}

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(root, nodeid.split("::", 1)[0], units)

        def _check_nodes_have_same_collection(self) -> bool:
            same = bool(super()._check_nodes_have_same_collection())
            for nodeid in next(iter(self.registered_collections.values()), []):
                module = nodeid.split("::", 1)[0]
                record.collected[module] = record.collected.get(module, 0) + 1
            return same

    return ModuleOrMachine(config, log)
