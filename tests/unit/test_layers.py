"""docs/architecture.md's layers, as data: which rooms each room may import, and no import loop
between modules. Read from the source (tests/support/imports.py), function-level imports too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.imports import modules, references

ROOT = Path(__file__).resolve().parents[2]

# room -> the rooms it may import (besides itself and the package root: __version__).
MAY_IMPORT: dict[str, set[str]] = {
    "vocabulary": set(),
    "api": {"vocabulary"},
    "shapes": {"vocabulary"},
    "render": {"vocabulary", "api", "shapes"},  # pure: no kube, no I/O room
    "kube": {"vocabulary", "api"},
    "node": {"vocabulary"},  # node agents: never controllers or render
    "statusview": {"vocabulary", "api", "shapes", "render", "kube"},
    "controllers": {"vocabulary", "api", "shapes", "render", "kube", "statusview"},  # what `run` runs
    "admin": {
        "vocabulary",
        "api",
        "shapes",
        "render",
        "kube",
        "statusview",
        "controllers",
    },  # a person's commands
    "sim": {
        "vocabulary",
        "api",
        "shapes",
        "render",
        "kube",
        "node",
        "statusview",
    },  # runs the operator, never imports it
    # `images`: the chart rendered by Helm (sim/plane/helm.py), the operands and the mirror rule by render
    "install": {"vocabulary", "api", "shapes", "render", "sim"},
    "cli": {
        "vocabulary",
        "api",
        "shapes",
        "render",
        "kube",
        "node",
        "statusview",
        "controllers",
        "admin",
        "sim",
        "install",
    },
}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph() -> dict[str, set[str]]:
    known = modules()
    return {name: references(name, path, known) - {name} for name, path in known.items()}


def test_every_room_is_in_the_rules() -> None:
    rooms = {room(m) for m in modules()} - {""}
    assert rooms == set(MAY_IMPORT), "a room without rules (add it to MAY_IMPORT and docs/architecture.md)"


def test_an_import_only_points_down() -> None:
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in _graph().items()
        for t in targets
        if room(t) not in ({room(m), ""} | MAY_IMPORT[room(m)])
    )
    assert upward == [], "imports against docs/architecture.md's layers:\n" + "\n".join(upward)


def test_no_import_loop_between_modules() -> None:
    graph = _graph()
    # A package imports its own submodules (re-exports); a loop through a package's __init__
    # is a loop only if a submodule imports the package back.
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    loops = _cycles(edges)
    assert loops == [], "import loops:\n" + "\n".join(" -> ".join(c) for c in loops)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_node_host_imports_no_other_room_of_node() -> None:
    """node/host/ (reading the host) is the bottom of node/: the other rooms read the host through
    it, and it imports none of them."""
    host = "gpu_operator.node.host"

    def inside(module: str) -> bool:
        return module == host or module.startswith(host + ".")

    upward = sorted(
        f"{m} -> {t}"
        for m, targets in _graph().items()
        if inside(m)
        for t in targets
        if t.startswith("gpu_operator.node.") and not inside(t)
    )
    assert upward == [], "node/host/ imports another room of node/:\n" + "\n".join(upward)


def test_the_architecture_page_lists_every_room() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## Layers") : text.index("## From a ClusterPolicy")]
    listed = set(re.findall(r"^(\w+)(?:/|\.py)", block, flags=re.M))
    assert set(MAY_IMPORT) - {"cli"} <= listed, set(MAY_IMPORT) - listed


def test_only_kube_speaks_http() -> None:
    """No request is sent from controllers/ itself (kube/ holds the client, the watches, the lists,
    the eviction), and no wire decoder lives there."""
    root = Path(__file__).resolve().parents[2] / "src" / "gpu_operator" / "controllers"
    sending = re.compile(r"\.http\.(get|post|put|patch|delete|stream|request)\(")
    found = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if sending.search(line) or re.match(r"\s*(import msgspec|from msgspec)", line)
    ]
    assert found == [], f"HTTP or wire decoding in controllers/: {found}; move it to kube/"


# kube/ is the only room that knows the apiserver's URLs and builds clients to it. Two rooms may
# too, for a reason the layers force:
# - sim/ builds and serves the control plane the operator runs against (it writes its RBAC, waits
#   for its resources, plays kubelets and NFD), and must not import what it tests against beyond
#   kube/'s kinds: its paths and clients are the simulator's own;
# - node/ may build clients, never spell a path: its agents may import only vocabulary (they run on
#   every node, with the node's own ServiceAccount), so they cannot use kube/; their in-cluster
#   client is lightkube's (node/cluster/kubeapi.py).
MAY_SPEAK_TO_THE_APISERVER = {"kube", "sim"}
MAY_BUILD_A_CLIENT = {"node"}
# `/api/...` at the start of a string or after a non-name character, or after a URL's host
# (`https://host:6443/api/v1`); not a file path's `pkg/apis/...`.
APISERVER_PATH = re.compile(r"(?:(?<![\w.-])|://[^/\s]*)/apis?(?:/|\?|$)")
CLIENT_CONSTRUCTORS = {"Client", "AsyncClient", "HTTPTransport", "AsyncHTTPTransport"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def apiserver_paths(source: str) -> list[int]:
    """Lines of string literals (f-string parts too, docstrings not) that spell an apiserver path:
    `/api/...`, `/apis/...`, or `/version`."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return sorted(
        {
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and (APISERVER_PATH.search(node.value) or node.value == "/version")
        }
    )


def client_constructions(source: str) -> list[int]:
    """Lines that build an HTTP or Kubernetes client (lightkube Client/AsyncClient, an httpx client
    or transport, `client_adapter.AsyncClient`), also under an alias (`import Client as C`)."""
    tree = ast.parse(source)
    names = set(CLIENT_CONSTRUCTORS) | {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in CLIENT_CONSTRUCTORS and alias.asname
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in names:
                found.append(node.lineno)
    return sorted(found)


def test_only_kube_knows_urls_and_builds_clients() -> None:
    paths, clients = [], []
    for name, path in sorted(modules().items()):
        if room(name) in MAY_SPEAK_TO_THE_APISERVER:
            continue
        source = path.read_text()
        paths += [f"{name}:{line}" for line in apiserver_paths(source)]
        if room(name) not in MAY_BUILD_A_CLIENT:
            clients += [f"{name}:{line}" for line in client_constructions(source)]
    assert paths == [], f"apiserver paths spelled outside kube/: {paths}; add a typed call to kube/reads.py"
    assert clients == [], f"clients built outside kube/: {clients}; use kube/reach.py's run_kube (or Kube)"


def test_the_scans_find_what_they_look_for() -> None:
    """The two scans above on code that breaks the rule, and on code that only looks like it."""
    planted = '''
"""A docstring may name /api/v1/nodes."""
import httpx2, lightkube
from lightkube import Client as Lk
def f(ns):
    http = httpx2.AsyncClient(base_url="https://apiserver")
    lk = lightkube.AsyncClient()
    plain = Lk()
    return http.get(f"/api/v1/namespaces/{ns}/pods"), http.get("/apis/apps/v1/daemonsets"), http.get("/version")
'''
    assert apiserver_paths(planted) == [9]
    assert client_constructions(planted) == [6, 7, 8]
    url = 'u = "https://10.0.0.1:6443/api/v1/nodes"\n'
    assert apiserver_paths(url) == [1]
    harmless = 'x = ("/proc/driver/nvidia/version", "pkg/apis/deviceplugin", "/readyz", "/apiary")\n'
    assert apiserver_paths(harmless) == [] and client_constructions(harmless) == []
    # the real tree: kube/ has both, so the scans read its files
    kube = modules()["gpu_operator.kube.client"].read_text()
    assert apiserver_paths(kube) and client_constructions(kube)
