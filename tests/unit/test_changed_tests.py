"""`./dev test --changed`'s selection (tools/changed_tests.py), on small trees built here and once
on the repository itself: a changed module selects the tests that import it directly or through
other modules and no others, a changed test selects itself, a conftest its folder's tests, a chart
or docs change the tests that read those paths, and the change is read from git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tools.changed_tests import ROOT, Graph, changed_files, main, select

TREE = {
    "src/gpu_operator/__init__.py": "",
    "src/gpu_operator/render/__init__.py": "",
    "src/gpu_operator/render/rbac.py": "RULES = []\n",
    "src/gpu_operator/render/driver.py": "from . import rbac\n\ndef render():\n    return rbac.RULES\n",
    "src/gpu_operator/render/data/layouts.txt": "a\n",
    "src/gpu_operator/kube/__init__.py": "",
    "src/gpu_operator/kube/client.py": "import json\n",
    "tests/support/kit.py": "def helper():\n    from gpu_operator.render.driver import render\n    return render()\n",
    "tests/support/chart.py": (
        "from pathlib import Path\n\n"
        "CHART = Path(__file__).resolve().parents[2] / 'deployments' / 'gpu-operator'\n"
    ),
    "tests/unit/render/conftest.py": "import pytest\n",
    "tests/unit/render/test_driver.py": "from tests.support.kit import helper\n",
    "tests/unit/kube/test_client.py": "from gpu_operator.kube import client\n",
    "tests/unit/chart/test_values.py": "from tests.support.chart import CHART\n\nVALUES = CHART / 'values.yaml'\n",
    "tests/unit/docs/test_pages.py": (
        "from pathlib import Path\n\nROOT = Path(__file__).resolve().parents[3]\n\n"
        "def test_pages():\n    return sorted((ROOT / 'docs').glob('*.md'))\n"
    ),
    "tests/unit/test_scratch.py": "def test_scratch(tmp_path):\n    (tmp_path / 'docs' / 'x.md').write_text('')\n",
    "deployments/gpu-operator/values.yaml": "a: 1\n",
    "deployments/cozystack/values.yaml": "a: 1\n",
    "docs/page.md": "# page\n",
    "pyproject.toml": "",
}


def tree(root: Path, files: dict[str, str] = TREE) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def chosen(root: Path, *changed: str) -> dict[str, str]:
    return select(Graph.read(root), list(changed)).tests


def test_a_changed_module_selects_the_tests_that_import_it_through_other_modules(tmp_path: Path) -> None:
    tests = chosen(tree(tmp_path), "src/gpu_operator/render/rbac.py")
    # test_driver -> tests.support.kit (inside a function) -> render.driver -> (relative) render.rbac
    assert tests == {
        "tests/unit/render/test_driver.py": "imports gpu_operator.render.rbac (through tests.support.kit)"
    }


def test_a_package_init_reaches_every_importer_below_it(tmp_path: Path) -> None:
    tests = chosen(tree(tmp_path), "src/gpu_operator/__init__.py")
    assert set(tests) == {"tests/unit/render/test_driver.py", "tests/unit/kube/test_client.py"}


def test_a_changed_test_selects_itself_only(tmp_path: Path) -> None:
    assert chosen(tree(tmp_path), "tests/unit/kube/test_client.py") == {
        "tests/unit/kube/test_client.py": "changed"
    }


def test_a_support_module_selects_its_importers_and_a_conftest_its_folder(tmp_path: Path) -> None:
    root = tree(tmp_path)
    assert chosen(root, "tests/support/kit.py") == {
        "tests/unit/render/test_driver.py": "imports tests.support.kit"
    }
    assert list(chosen(root, "tests/unit/render/conftest.py")) == ["tests/unit/render/test_driver.py"]


def test_the_chart_selects_the_tests_that_read_it(tmp_path: Path) -> None:
    root = tree(tmp_path)
    reader = {
        "tests/unit/chart/test_values.py": "imports tests.support.chart, which reads deployments/gpu-operator"
    }
    assert chosen(root, "deployments/gpu-operator/templates/rbac.yaml") == reader
    # test_values names CHART / "values.yaml" itself, CHART imported from tests.support.chart
    assert chosen(root, "deployments/gpu-operator/values.yaml") == {
        "tests/unit/chart/test_values.py": "reads deployments/gpu-operator/values.yaml"
    }
    assert chosen(root, "deployments/cozystack/values.yaml") == {}  # the reader names the other chart


def test_docs_select_the_tests_that_read_them_not_a_scratch_folder_of_that_name(tmp_path: Path) -> None:
    assert chosen(tree(tmp_path), "docs/page.md") == {"tests/unit/docs/test_pages.py": "reads docs"}


def test_package_data_counts_as_a_change_to_its_folders_modules(tmp_path: Path) -> None:
    tests = chosen(tree(tmp_path), "src/gpu_operator/render/data/layouts.txt")
    assert set(tests) == {"tests/unit/render/test_driver.py"}
    assert tests["tests/unit/render/test_driver.py"].endswith(
        ", which reads src/gpu_operator/render/data/layouts.txt"
    )


def test_a_deleted_module_still_selects_its_importers(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "src/gpu_operator/kube/client.py").unlink()
    assert set(chosen(root, "src/gpu_operator/kube/client.py")) == {"tests/unit/kube/test_client.py"}


def test_pyproject_selects_every_unit_test_and_an_unread_file_is_said(tmp_path: Path) -> None:
    root = tree(tmp_path)
    every = select(Graph.read(root), ["pyproject.toml"])
    assert set(every.tests) == {path for path in TREE if path.startswith("tests/unit/") and "/test_" in path}
    assert [note.split(" ")[0] for note in every.notes] == ["pyproject.toml"]
    nothing = select(Graph.read(root), ["notes/todo.txt"])
    assert (nothing.tests, nothing.notes) == ({}, ["notes/todo.txt: no test imports or reads it"])


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_the_change_is_the_working_tree_and_untracked_files_against_a_ref(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    (root / "src/gpu_operator/render/rbac.py").write_text("RULES = [1]\n")
    (root / "docs/new.md").write_text("# new\n")
    assert changed_files(root, "HEAD") == ["docs/new.md", "src/gpu_operator/render/rbac.py"]
    git(root, "commit", "-q", "-am", "two")
    assert changed_files(root, "HEAD") == ["docs/new.md"]
    assert changed_files(root, "HEAD~1") == ["docs/new.md", "src/gpu_operator/render/rbac.py"]

    assert main(["HEAD~1"], root) == 0
    out, err = capsys.readouterr()
    assert out.split() == ["tests/unit/docs/test_pages.py", "tests/unit/render/test_driver.py"]
    lines = err.splitlines()
    assert lines[0] == "changed_tests: 2 file(s) differ from HEAD~1 (with untracked files)"
    assert [line.split()[0] for line in lines[1:]] == out.split()
    assert lines[2].endswith("(imports gpu_operator.render.rbac (through tests.support.kit))")

    with pytest.raises(SystemExit, match="no-such-ref.* is not a commit"):
        changed_files(root, "no-such-ref")


def test_on_this_repository_the_chart_selects_chart_tests_and_not_node_agent_tests() -> None:
    graph = Graph.read(ROOT)
    chart = select(graph, ["deployments/gpu-operator/values.yaml"]).tests
    assert "tests/unit/chart/test_chart_values.py" in chart
    assert "tests/unit/render/test_dra.py" not in chart
    render = select(graph, ["src/gpu_operator/render/dra/rbac.py"]).tests
    assert "tests/unit/render/test_dra.py" in render
    assert "tests/unit/chart/test_chart_values.py" not in render
