"""The tests a change touches, for `./dev test --changed [REF]`: the inner loop's subset of `./dev test`.

A change is every file that differs from REF (default HEAD; for a branch, from its merge base with
HEAD) in the working tree, staged or not, and every untracked file git does not ignore. The
import graph is read statically with `ast` from the tree (src/gpu_operator as `gpu_operator.*`;
tests/, tools/, bench/ from the repository root, as pytest's `pythonpath = ["."]` imports them).
A test file (tests/**/test_*.py) is selected when:

- it changed itself;
- it imports a changed module, directly or through any chain of modules (src, tests/support, test
  kits, tools); importing `a.b.c` also imports the packages `a` and `a.b`; a conftest.py counts as
  imported by every test under its folder;
- it, or a module it imports as above, names a changed file's path in its code (a path built with
  `/`, `joinpath`, `glob` from the repository root or from its own `Path(__file__)`, or a
  "dir/file" string constant), or a folder above that path. This is how a change to the chart
  (deployments/: tests/support/chart.py's CHART, src/gpu_operator/sim/plane/helm.py's CHART_DIR), the
  docs (docs/*.md, README.md), golden files and fixtures select the tests that read them;
- a changed data file under src/gpu_operator (CRDs, shapes, tables) counts as a change to the
  modules of the nearest folder above it that holds Python files (they read it as package data).

pyproject.toml or ./dev changed (the packages and the test configuration every test runs with):
every unit test is selected too, and the full `./dev test` is the check for the rest. A test that
runs our code in another process (`python -m gpu_operator.cli run`) is selected only through what
it imports: `./dev test --changed` is the inner loop, `./dev test` the gate.

Prints one line per selected test file with its reason on stderr and the files on stdout.
"""

from __future__ import annotations

import argparse
import ast
import posixpath
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_ROOTS = ("tests", "tools", "bench")  # importable from the repository root
EVERY_UNIT_TEST = {"pyproject.toml": "the packages and the test configuration", "dev": "./dev itself"}
GLOB = set("*?[")
JOINS = ("joinpath", "glob", "rglob")


def is_test(path: str) -> bool:
    name = posixpath.basename(path)
    return (
        path.startswith("tests/")
        and name.endswith(".py")
        and (name.startswith("test_") or name.endswith("_test.py"))
    )


def module_name(path: str) -> str | None:
    """The module a repository-relative .py path is imported as, None for one that is not."""
    if not path.endswith(".py"):
        return None
    if path.startswith("src/"):
        parts = path[len("src/") : -3].split("/")
    elif path.split("/", 1)[0] in PYTHON_ROOTS:
        parts = path[:-3].split("/")
    else:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts else None


def _package_of(name: str, path: str) -> str:
    return name if path.endswith("/__init__.py") else name.rpartition(".")[0]


def imported(tree: ast.AST, name: str, path: str) -> set[str]:
    """Every module name an import statement in the tree names (top level and inside functions)."""
    refs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            refs.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name, path).split(".")
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            refs.add(base)
            refs.update(f"{base}.{alias.name}" for alias in node.names)
    return refs


def named_paths(graph: Graph, path: str) -> set[str]:
    """The repository paths a file names in its code (see the module's docstring)."""
    named: set[str] = set()
    joined: set[int] = set()  # the inner parts of a chain already named whole
    for node in ast.walk(graph.trees[path]):
        if id(node) in joined:
            continue
        if (
            isinstance(node, ast.BinOp)
            or isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in JOINS
        ):
            where = resolve(graph, path, node, joined)
            if where:
                named.add(where)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named.update(_string_path(node.value))
    return named


def resolve(graph: Graph, path: str, node: ast.AST, joined: set[int], depth: int = 0) -> str | None:
    """The repository-relative path an expression in `path` builds; None when it builds none we can
    tell (a base from a parameter, `tmp_path`, `resources.files(...)`)."""
    if depth > 12:
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _join(graph, path, node.left, [node.right], joined, depth)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in JOINS and node.args:
            return _join(graph, path, node.func.value, node.args, joined, depth)
        if node.func.attr in ("resolve", "absolute") and not node.args:
            return resolve(graph, path, node.func.value, joined, depth + 1)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Path"
        and [getattr(arg, "id", None) for arg in node.args] == ["__file__"]
    ):
        return path
    up, base = 0, node
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        up, base = 1, node.value
    elif (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "parents"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        up, base = node.slice.value + 1, node.value.value
    if up:
        where = resolve(graph, path, base, joined, depth + 1)
        for _ in range(up if where is not None else 0):
            where = posixpath.dirname(where or "")
        return where
    if isinstance(node, ast.Name):  # a module-level constant, here or imported
        found = graph.definition(path, node.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # module.CONSTANT
        found = graph.definition(path, f"{node.value.id}.{node.attr}")
    else:
        return None
    return None if found is None else resolve(graph, found[0], found[1], set(), depth + 1)


def _join(
    graph: Graph, path: str, base: ast.AST, parts: list[ast.expr], joined: set[int], depth: int
) -> str | None:
    segments: list[str] = []
    for part in parts:
        if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
            break
        joined.add(id(part))
        segments.append(part.value)
    if not segments:
        return None
    if isinstance(base, ast.BinOp | ast.Call):
        joined.add(id(base))
    start = resolve(graph, path, base, joined, depth + 1)
    if start is None:
        return None
    kept = []
    for segment in posixpath.join(start, *segments).split("/"):
        if GLOB & set(segment):
            break
        kept.append(segment)
    where = posixpath.normpath("/".join(kept)) if kept else ""
    return None if where in (".", "") or where.startswith(("..", "/")) else where


def _string_path(text: str) -> set[str]:
    """A "dir/file" constant names a repository path; free text, URLs, absolute paths and "dir/"
    prefixes (compared with, not read) do not."""
    if (
        "/" not in text
        or text.startswith("/")
        or text.endswith("/")
        or "://" in text
        or any(c.isspace() for c in text)
    ):
        return set()
    return {posixpath.normpath(text)}


@dataclass
class Graph:
    """Every Python file of the tree: the module names it imports and the paths it names."""

    root: Path
    modules: dict[str, str] = field(default_factory=dict)  # module name -> repository path
    trees: dict[str, ast.Module] = field(default_factory=dict)  # repository path -> its syntax tree
    imports: dict[str, set[str]] = field(default_factory=dict)  # repository path -> module names
    names: dict[str, set[str]] = field(default_factory=dict)  # repository path -> paths it names
    defined: dict[str, dict[str, ast.expr]] = field(default_factory=dict)  # module-level X = ...
    aliases: dict[str, dict[str, str]] = field(default_factory=dict)  # from M import X: X -> M.X

    @classmethod
    def read(cls, root: Path) -> Graph:
        graph = cls(root)
        for file in (p for top in ("src", *PYTHON_ROOTS) for p in sorted((root / top).rglob("*.py"))):
            path = file.relative_to(root).as_posix()
            name = module_name(path)
            if name is None or "/fixtures/" in path:
                continue
            graph.modules[name] = path
            tree = graph.trees[path] = ast.parse(file.read_text(), path)
            closed: set[str] = set()  # a.b.c imports a and a.b too
            for ref in imported(tree, name, path):
                parts = ref.split(".")
                closed.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            graph.imports[path] = closed
            graph.defined[path] = {
                target.id: node.value
                for node in tree.body
                if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            graph.aliases[path] = {
                alias.asname or alias.name: f"{node.module}.{alias.name}"
                for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                for alias in node.names
            }
        for path in graph.trees:
            graph.names[path] = named_paths(graph, path)
        return graph

    def definition(self, path: str, name: str) -> tuple[str, ast.expr] | None:
        """Where a module-level name of `path` is assigned ("X" or "module.X"): the file and value."""
        head, _, attr = name.partition(".")
        if not attr and head in self.defined.get(path, {}):
            return path, self.defined[path][head]
        full = self.aliases.get(path, {}).get(head)
        if full is None:
            return None
        if attr:  # from package import module; module.X
            where = self.modules.get(full)
            return None if where is None else self.definition(where, attr)
        module, _, attr = full.rpartition(".")
        where = self.modules.get(module)
        return None if where is None else self.definition(where, attr)

    def importers(self) -> dict[str, set[str]]:
        """Repository path -> the files that import it (a conftest: the tests under its folder)."""
        back: dict[str, set[str]] = {}
        for path, refs in self.imports.items():
            for ref in refs:
                if ref in self.modules:
                    back.setdefault(self.modules[ref], set()).add(path)
        conftests = [p for p in self.imports if posixpath.basename(p) == "conftest.py"]
        for test in filter(is_test, self.imports):
            for conftest in conftests:
                if test.startswith(posixpath.dirname(conftest) + "/"):
                    back.setdefault(conftest, set()).add(test)
        return back


@dataclass
class Selection:
    tests: dict[str, str]  # test file -> why
    notes: list[str]  # changed files that select every unit test, or nothing


def select(graph: Graph, changed: list[str]) -> Selection:
    seeds: dict[
        str, str
    ] = {}  # a changed or reading file -> what its importers are told ("" or ", which reads X")
    tests: dict[str, str] = {}
    notes: list[str] = []
    for path in sorted(set(changed)):
        before = len(seeds) + len(tests)
        if is_test(path) and path in graph.imports:
            tests[path] = "changed"
        name = module_name(path)
        if name is not None:
            graph.modules.setdefault(name, path)  # deleted: its importers still name it
            seeds.setdefault(path, "")
        elif path.startswith("src/"):  # package data: the modules of the nearest folder with some
            folder = posixpath.dirname(path)
            while folder.startswith("src/"):
                holders = [p for p in graph.imports if posixpath.dirname(p) == folder]
                for holder in holders:
                    seeds.setdefault(holder, f", which reads {path}")
                if holders:
                    break
                folder = posixpath.dirname(folder)
        for reader, named in graph.names.items():
            hit = sorted(n for n in named if path == n or path.startswith(n + "/"))
            if hit:
                seeds.setdefault(reader, f", which reads {hit[0]}")
                if is_test(reader):
                    tests.setdefault(reader, f"reads {hit[0]}")
        if path in EVERY_UNIT_TEST:
            notes.append(
                f"{path} changed ({EVERY_UNIT_TEST[path]}): every unit test; "
                "the full ./dev test checks the rest"
            )
            for test in filter(is_test, graph.imports):
                if test.startswith("tests/unit/"):
                    tests.setdefault(test, f"{path} changed")
        elif len(seeds) + len(tests) == before:
            notes.append(f"{path}: no test imports or reads it")
    back = graph.importers()
    origin = {path: path for path in seeds}  # each reached file -> the seed of its shortest chain
    queue = deque(sorted(seeds))
    while queue:  # breadth first
        path = queue.popleft()
        for importer in sorted(back.get(path, ())):
            if importer in origin:
                continue
            origin[importer] = seed = origin[path]
            queue.append(importer)
            if is_test(importer) and importer not in tests:  # says the module it imports on the way
                through = "" if path == seed else f" (through {module_name(path)})"
                tests[importer] = f"imports {module_name(seed)}{through}{seeds[seed]}"
    return Selection(dict(sorted(tests.items())), notes)


def changed_files(root: Path, ref: str) -> list[str]:
    def git(*args: str) -> list[str]:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"changed_tests: git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.split("\n")

    verify = ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"]
    if subprocess.run(verify, cwd=root, capture_output=True).returncode != 0:
        sys.exit(f"changed_tests: {ref!r} is not a commit here: give a branch, tag or commit (default HEAD)")
    base = git("merge-base", ref, "HEAD")[0]
    paths = git("diff", "--name-only", "--no-renames", base, "--") + git(
        "ls-files", "--others", "--exclude-standard"
    )
    return sorted({p for p in paths if p})


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", nargs="?", default="HEAD", help="compare with this commit (default HEAD)")
    args = parser.parse_args(argv)
    changed = changed_files(root, args.ref)
    print(
        f"changed_tests: {len(changed)} file(s) differ from {args.ref} (with untracked files)",
        file=sys.stderr,
    )
    chosen = select(Graph.read(root), changed)
    for note in chosen.notes:
        print(f"  {note}", file=sys.stderr)
    width = max((len(t) for t in chosen.tests), default=0)
    for test, reason in chosen.tests.items():
        print(f"{test:<{width}}  ({reason})", file=sys.stderr)
        print(test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
