"""Every test process: lightkube's types made ready before a test or a stand-in starts a thread
that decodes (src/gpu_operator/node/cluster/kubetypes.py: two threads that decode a type for the first
time at once crash the process), and a crash in a process the tests start prints every thread's
stack (PYTHONFAULTHANDLER; pytest's own faulthandler plugin does it for this process)."""

from __future__ import annotations

import os
import re
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
# names one of HOST_FIXTURES (a test or a fixture of its own asks for it) or it is in HOST_MODULES.
# (xdist's own `loadgroup` cannot do it with pytest 9: it rewrites a test's `_nodeid`, which
# pytest 9's `nodeid` no longer reads, so its groups never reach the scheduler.)
HOST_FIXTURES = ("real_node", "real_gpu_node", "real_passthrough_node", "device_plugin_pod", "registry_image")
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


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))
    units: dict[str, str] = {}

    class ModuleOrMachine(LoadFileScheduling):  # type: ignore[misc]  # xdist ships no types
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(root, nodeid.split("::", 1)[0], units)

    return ModuleOrMachine(config, log)
