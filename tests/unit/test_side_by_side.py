"""`./dev test`'s worker units (tests/conftest.py): every module that uses this machine's shared
parts is in the one machine unit (one worker, one after another); every other module is its own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]


def conftest() -> Any:
    spec = importlib.util.spec_from_file_location("tests_root_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_real_node_the_images_and_what_borrows_them_share_one_worker() -> None:
    c = conftest()
    units: dict[str, str] = {}
    unit = {
        f.relative_to(ROOT).as_posix(): c.work_unit(ROOT, f.relative_to(ROOT).as_posix(), units)
        for f in sorted((ROOT / "tests").glob("*/test_*.py"))
    }
    machine = {m for m, u in unit.items() if u == c.HOST_GROUP}
    assert {
        "tests/integration/test_real_node.py",
        "tests/integration/test_real_node_operator.py",
        "tests/integration/test_helm_real_node.py",
        "tests/integration/test_sim_cli.py",
        "tests/image/test_image.py",
        "tests/integration/test_registry_install.py",
        "tests/integration/test_registry_recovery.py",  # borrows the install's fixtures
        "tests/integration/test_registry_release_image.py",  # builds dist/'s image archive
    } <= machine
    for module, owner in unit.items():
        assert owner in (module, c.HOST_GROUP), module
    assert unit["tests/integration/test_sim_faults.py"] == "tests/integration/test_sim_faults.py"


def test_a_module_naming_a_machine_fixture_joins_the_machine(tmp_path: Path) -> None:
    c = conftest()
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    (tmp_path / "tests/integration/test_a.py").write_text("def test_x(real_gpu_node): ...\n")
    (tmp_path / "tests/integration/test_b.py").write_text("from tests.integration.test_a import helper\n")
    (tmp_path / "tests/integration/test_c.py").write_text(
        "def test_y(kube): ...  # a real_nodes word is not one\n"
    )
    units: dict[str, str] = {}
    assert [c.work_unit(tmp_path, f"tests/integration/test_{n}.py", units) for n in "abc"] == [
        c.HOST_GROUP,
        c.HOST_GROUP,
        "tests/integration/test_c.py",
    ]


def test_a_unit_weighs_its_recorded_seconds_else_an_estimate_else_its_tests() -> None:
    c = conftest()
    long_one = next(iter(c.ESTIMATED_SECONDS))
    units = {
        "machine": ["tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t1"],
        long_one: [f"{long_one}::t"],
        "tests/c.py": ["tests/c.py::t1", "tests/c.py::t2"],
    }
    weights = c.unit_weights(units, {"tests/a.py": 50.0})
    assert weights == {
        "machine": 50.0 + c.SECONDS_PER_TEST,
        long_one: c.ESTIMATED_SECONDS[long_one],
        "tests/c.py": 2 * c.SECONDS_PER_TEST,
    }


def test_the_queue_hands_out_the_heaviest_unit_first() -> None:
    c = conftest()
    queue = c.LongestFirst()
    queue.known = {"tests/one_long.py": 300.0}
    for unit, tests in (
        ("tests/many.py", 5),
        ("tests/two.py", 2),
        ("tests/one_long.py", 1),
        ("tests/b.py", 2),
    ):
        queue[unit] = {f"{unit}::t{i}": False for i in range(tests)}
    order = [queue.popitem(last=False)[0] for _ in range(len(queue))]
    assert order == ["tests/one_long.py", "tests/many.py", "tests/two.py", "tests/b.py"]  # ties: as queued


class FakeCache:
    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def get(self, key: str, default: Any) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


def report(nodeid: str, when: str, duration: float) -> Any:
    return type("Report", (), {"nodeid": nodeid, "when": when, "duration": duration})()


def test_the_seconds_of_modules_run_whole_are_kept_and_others_left_as_they_were() -> None:
    c = conftest()
    cache = FakeCache({c.SECONDS_KEY: {"tests/old.py": 7.0, "tests/part.py": 90.0}})
    record = c.ModuleSeconds(cache)
    record.collected = {"tests/whole.py": 2, "tests/part.py": 2}
    for nodeid in ("tests/whole.py::a", "tests/whole.py::b", "tests/part.py::a"):
        for when, seconds in (("setup", 1.0), ("call", 2.0), ("teardown", 0.5)):
            record.pytest_runtest_logreport(report(nodeid, when, seconds))
    record.pytest_sessionfinish()
    assert cache.values[c.SECONDS_KEY] == {"tests/old.py": 7.0, "tests/part.py": 90.0, "tests/whole.py": 7.0}


def test_a_side_by_side_run_starts_with_the_longest_and_records_the_seconds(tmp_path: Path) -> None:
    """One worker, so the order of the queue is the order of the run: the one-test module the
    cache says is long goes before the module of three quick tests, and its seconds are renewed."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    log = tmp_path / "order.txt"
    slow = f"import time\n\ndef test_slow():\n    time.sleep(0.5)\n    open({str(log)!r}, 'a').write('slow\\n')\n"
    quick = "".join(
        f"\ndef test_quick_{i}():\n    open({str(log)!r}, 'a').write('quick\\n')\n" for i in range(3)
    )
    (tmp_path / "tests" / "test_slow.py").write_text(slow)
    (tmp_path / "tests" / "test_quick.py").write_text(quick)
    cached = tmp_path / ".pytest_cache/v/gpu-operator/module-seconds"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"tests/test_slow.py": 100.0, "tests/elsewhere.py": 3.0}))
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "1", "--dist", "loadfile", "tests"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert log.read_text().split() == ["slow"] + ["quick"] * 3
    recorded = json.loads(cached.read_text())
    assert set(recorded) == {"tests/test_slow.py", "tests/test_quick.py", "tests/elsewhere.py"}
    assert 100.0 > recorded["tests/test_slow.py"] >= 0.5 > recorded["tests/test_quick.py"]
