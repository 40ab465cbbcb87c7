"""`./dev test`'s worker units (tests/conftest.py): every module that uses this machine's shared
parts is in the one machine unit (one worker, one after another); every other module is its own."""

from __future__ import annotations

import importlib.util
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
        "tests/integration/test_registry_recovery.py",
    } <= machine  # the last borrows the install's fixtures
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
