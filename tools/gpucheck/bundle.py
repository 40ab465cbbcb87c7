"""`./dev gpu-check-bundle`: what a GPU machine without network needs to run `gpu-operator node gpu-check`,
as wheels for its Python (CPython 3.12, x86_64, glibc): our wheel, and of our dependencies only the ones
the check imports (CHECK_DISTRIBUTIONS, at the versions tools/image/requirements.lock pins), plus run.sh
that installs them into a virtualenv under /tmp with pip --no-index and runs the check.

Writes dist/gpu-check/ (ignored): wheels/*.whl, run.sh. Refuses a bundle over 64 MiB. Needs the package
index that pip here uses. tests/unit/node/gpucheck/test_gpucheck_bundle.py holds that the check imports nothing
outside CHECK_DISTRIBUTIONS.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "tools" / "image" / "requirements.lock"
OUT = REPO / "dist" / "gpu-check"
LIMIT = 64 << 20
# What `gpu-operator node gpu-check` imports besides the standard library and our package: the CLI
# (typer and what it needs), the agents' models (pydantic), the report (rich), the host files' YAML,
# the exporter (prometheus-client) and NVML's bindings. Not kopf, lightkube or the rest: the node
# agents import those only inside the commands that talk to the API.
CHECK_DISTRIBUTIONS = (
    "annotated-doc",
    "annotated-types",
    "markdown-it-py",
    "mdurl",
    "nvidia-ml-py",
    "prometheus-client",
    "pydantic",
    "pydantic-core",
    "pygments",
    "pyyaml",
    "rich",
    "shellingham",
    "typer",
    "typing-extensions",
    "typing-inspection",
)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 26, 24, 17)] + ["manylinux2014_x86_64"]
RUN_SH = """\
#!/bin/sh
# Run gpu-check on this machine from the wheels beside this script, without network: a virtualenv
# under /tmp (GPU_CHECK_VENV), filled with pip --no-index, then `gpu-operator node gpu-check ARGS`
# (default: --host-root /). PYTHON: the interpreter to use (default python3, 3.12 expected).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
venv=${GPU_CHECK_VENV:-/tmp/gpu-check-venv}
start=$(date +%s)
rm -rf "$venv"
if "$py" -m venv --without-pip "$venv"; then
  run="$venv/bin/python"
  site=$("$run" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
else  # a Python without the venv module: a plain directory first on PYTHONPATH
  echo "gpu-check: no virtualenv; installing into $venv/site on PYTHONPATH instead" >&2
  run=$py site="$venv/site"
  mkdir -p "$site"; export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps --no-compile --target "$site" \\
  "$here"/wheels/*.whl
echo "gpu-check: installed $(ls "$here"/wheels | wc -l) wheels into $venv in $(( $(date +%s) - start )) s" >&2
exec "$run" -m gpu_operator.cli node gpu-check "$@"
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """name -> version of every package the image installs (tools/image/requirements.lock)."""
    out = {}
    for line in LOCK.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, rest = line.partition("==")
            out[norm(name)] = rest.split()[0]
    return out


def run(argv: list[str]) -> None:
    print("+ " + " ".join(argv), file=sys.stderr)
    subprocess.run(argv, check=True, cwd=REPO)


def build(out: Path, python_version: str) -> Path:
    locked = pins()
    missing = [d for d in CHECK_DISTRIBUTIONS if d not in locked]
    if missing:
        sys.exit(
            f"gpu-check-bundle: {', '.join(missing)} not in {LOCK.relative_to(REPO)}: run tools/image/lock.sh"
        )
    wheels = out / "wheels"
    shutil.rmtree(out, ignore_errors=True)
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(REPO)])
    platform = [f"--platform={p}" for p in PLATFORMS]
    abi = f"cp{python_version.replace('.', '')}"
    run(
        [
            *pip,
            "download",
            "--no-deps",
            "--only-binary=:all:",
            f"--python-version={python_version}",
            "--implementation=cp",
            f"--abi={abi}",
            "--abi=abi3",
            "--abi=none",
            *platform,
            "-d",
            str(wheels),
            *(f"{d}=={locked[d]}" for d in CHECK_DISTRIBUTIONS),
        ]
    )
    script = out / "run.sh"
    script.write_text(RUN_SH)
    script.chmod(0o755)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=OUT, help=f"bundle directory (default {OUT.relative_to(REPO)})"
    )
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    args = parser.parse_args()
    started = time.monotonic()
    out = build(args.out, args.python_version)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size:>10}  {p.relative_to(out)}")
    print(
        f"gpu-check bundle: {out}: {len(files)} files, {size / (1 << 20):.1f} MiB "
        f"(limit {LIMIT >> 20} MiB), built in {time.monotonic() - started:.0f} s"
    )
    if size > LIMIT:
        sys.exit(f"gpu-check-bundle: {size} bytes is over the {LIMIT >> 20} MiB a GPU machine's call carries")


if __name__ == "__main__":
    main()
