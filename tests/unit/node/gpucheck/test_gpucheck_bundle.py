"""The gpu-check bundle carries only some of our dependencies (tools/gpucheck/bundle.py's
CHECK_DISTRIBUTIONS): the check, run as its command on a host tree and on this machine's /, imports
nothing from any other distribution, so the bundle installs with pip --no-deps and still runs."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.unit.node.conftest import BuildHost

REPO = Path(__file__).resolve().parents[4]
SCRIPT = """
import importlib.metadata as md, json, sys
before = set(sys.modules)
from gpu_operator.cli import app
*runs, result = sys.argv[1:]
for root, out in zip(runs[::2], runs[1::2]):
    try:
        app(["node", "gpu-check", "--host-root", root, "--out", out])
    except SystemExit:
        pass
owners = md.packages_distributions()
loaded = {m.split(".")[0] for m in set(sys.modules) - before}
json.dump(sorted({d for m in loaded for d in owners.get(m, [])}), open(result, "w"))
"""


def check_distributions() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location(
        "gpucheck_bundle", REPO / "tools" / "gpucheck" / "bundle.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.CHECK_DISTRIBUTIONS)


def test_the_check_imports_only_what_the_bundle_carries(build_host: BuildHost, tmp_path: Path) -> None:
    tree = build_host("h100-nvidia-bound").fs.root
    result = tmp_path / "dists.json"
    argv = [
        sys.executable,
        "-c",
        SCRIPT,
        str(tree),
        str(tmp_path / "a"),
        "/",
        str(tmp_path / "b"),
        str(result),
    ]
    subprocess.run(argv, check=True, capture_output=True, timeout=120, cwd=tmp_path)
    used = {re.sub(r"[-_.]+", "-", d).lower() for d in json.loads(result.read_text())}
    assert "pydantic" in used and "nvidia-ml-py" in used  # the agents' models; NVML asked on this machine's /
    assert used - {"gpu-operator"} <= set(check_distributions())
    assert (tmp_path / "a" / "report.json").is_file() and (tmp_path / "b" / "report.json").is_file()
