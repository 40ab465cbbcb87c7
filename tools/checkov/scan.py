"""checkov over every render of the chart and of the operator, and over NVIDIA's v26.7.0 for comparison.

    .venv/bin/python -m tools.checkov.scan [--nvidia DIR] [--keep DIR]      (from the repository root)

Renders (each into its own folder, one YAML file per object) and runs checkov once over all of them
(`checkov -d ROOT --framework kubernetes -o json`, checkov from tools/checkov/build.sh):

- chart-<preset>: `helm template` of deployments/gpu-operator with the default values and with each
  preset (values-container.yaml, values-passthrough.yaml, values-vgpu.yaml), rendered by Helm's own
  engine (helm-python-sdk, as tests/support/chart.py does);
- operands-<policy>: `gpu-operator render --policy examples/clusterpolicy-<policy>.yaml --shape dgx-h100:2 --as-labelled`
  for the default policy and the policy of each preset; operands-gpucluster:
  `gpu-operator render --gpucluster examples/gpucluster.yaml`.

With --nvidia DIR (a checkout of NVIDIA/gpu-operator at v26.7.0: its deployments/gpu-operator and
assets/), also NVIDIA's chart with its default values (node-feature-discovery subchart included, as
it installs) and, for each operands render, NVIDIA's state manifests (assets/<state>/*.yaml, OpenShift
files left out) of the states that render enables. Prints a table of failed checks per render.
tests/unit/chart/test_checkov.py holds our renders to tools/checkov/allowlist.yaml.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deployments" / "gpu-operator"
PRESETS = ("default", "container", "passthrough", "vgpu")
# The policy that matches each chart preset (examples/clusterpolicy-<name>.yaml).
POLICIES = {
    "default": "default",
    "container": "container-host-driver",
    "passthrough": "vm-passthrough",
    "vgpu": "vm-vgpu",
}
SHAPE = "dgx-h100:2"
# The vGPU manager image is the user's own build; the vgpu preset needs it named (tests/support/chart.py).
VGPU_IMAGE = {"vgpuManager": {"repository": "registry.example.com/nvidia", "version": "17.4"}}
STATE_LABEL = "nvidia.com/gpu-operator.state"


@dataclass(frozen=True, order=True)
class Finding:
    """One failed check on one object of one render."""

    render: str
    check: str
    kind: str
    namespace: str
    name: str

    @property
    def resource(self) -> str:
        return f"{self.kind}/{self.name}"


def checkov_binary() -> str:
    """checkov from tools/checkov/build.sh (installs into its cache on first use)."""
    # the virtualenv is made from this interpreter (the project's Python) unless PYTHON names one
    env = {"PYTHON": sys.executable, **os.environ}
    build = ROOT / "tools" / "checkov" / "build.sh"
    done = subprocess.run([str(build)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{build} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def _write(folder: Path, objects: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, o in enumerate(objects):
        name = f"{i:03d}-{o.get('kind', 'x')}-{o.get('metadata', {}).get('name', 'x')}.yaml"
        (folder / name).write_text(yaml.safe_dump(o, sort_keys=False))


def _documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind")]


def helm_template(chart: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """`helm template gpu-operator CHART -n gpu-operator` (with values), by Helm's own engine."""
    import helm_python

    with helm_python.Chart.load(chart) as loaded:
        rendered = loaded.render(values, name="gpu-operator", namespace="gpu-operator", is_install=True)
    out: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith(".yaml") or path.endswith(".yml"):
            out += _documents(rendered[path])
    return out


def chart_values(preset: str) -> dict[str, Any]:
    if preset == "default":
        return {}
    values: dict[str, Any] = yaml.safe_load((CHART / f"values-{preset}.yaml").read_text())
    if preset == "vgpu":
        values["vgpuManager"] = {**values.get("vgpuManager", {}), **VGPU_IMAGE["vgpuManager"]}
    return values


def operator_render(**args: Any) -> list[dict[str, Any]]:
    """What `gpu-operator render ...` prints, through the command's own function."""
    from gpu_operator.render.clitext import run_render

    buf = io.StringIO()
    options: dict[str, Any] = {
        "policy": None,
        "nvidiadriver": None,
        "nodes": None,
        "shapes": [SHAPE],
        "namespace": "gpu-operator",
        "output": "yaml",
        "k8s_version": "1.36.0",
        "openshift": False,
        "as_labelled": True,
        **args,
    }
    with contextlib.redirect_stdout(buf):
        code = run_render(**options)
    if code != 0:
        raise RuntimeError(f"gpu-operator render {args} exited {code}")
    return _documents(buf.getvalue())


def our_renders() -> dict[str, list[dict[str, Any]]]:
    renders = {f"chart-{p}": helm_template(CHART, chart_values(p)) for p in PRESETS}
    for preset in PRESETS:
        policy = ROOT / "examples" / f"clusterpolicy-{POLICIES[preset]}.yaml"
        renders[f"operands-{preset}"] = operator_render(policy=policy)
    renders["operands-gpucluster"] = operator_render(gpucluster=ROOT / "examples" / "gpucluster.yaml")
    return renders


def nvidia_renders(
    nvidia: Path,
    ours: dict[str, list[dict[str, Any]]],
    dra: Path | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """NVIDIA's chart (default values, then each of our presets' values files: the keys are NVIDIA's) and,
    per operands render of ours, NVIDIA's manifests of the same states; for the GPUCluster, NVIDIA's DRA
    driver chart (`dra`, default values) with the DCGM exporter's state manifests."""
    chart = nvidia / "deployments" / "gpu-operator"
    renders = {f"chart-{p}": helm_template(chart, chart_values(p)) for p in PRESETS}
    assets = nvidia / "assets"
    for render, objects in ours.items():
        if not render.startswith("operands-"):
            continue
        states = {o["metadata"].get("labels", {}).get(STATE_LABEL) for o in objects}
        # our GPUCluster's states are named after the ClusterPolicy states they correspond to
        states = {s.removeprefix("gpucluster-") for s in states if s}
        docs: list[dict[str, Any]] = []
        for state in sorted(states):
            for f in sorted((assets / state).glob("*.y*ml")) if (assets / state).is_dir() else []:
                if "openshift" not in f.name:
                    docs += _documents(f.read_text())
        if render == "operands-gpucluster" and dra is not None:
            # its default (resources.gpus.enabled) needs this acknowledgement: no device plugin beside it,
            # as under a GPUCluster
            docs += helm_template(dra, {"gpuResourcesEnabledOverride": True})
        renders[render] = docs
    return renders


def run_checkov(renders: dict[str, list[dict[str, Any]]], keep: Path | None = None) -> list[Finding]:
    """Every failed check on every render (one checkov run over one folder per render)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = keep or Path(tmp)
        for render, objects in renders.items():
            _write(root / render, objects)
        done = subprocess.run(
            [
                checkov_binary(),
                "-d",
                str(root),
                "--framework",
                "kubernetes",
                "-o",
                "json",
                "--quiet",
                "--compact",
                "--skip-download",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "LOG_LEVEL": "ERROR"},
        )
        if done.returncode not in (0, 1):
            raise RuntimeError(f"checkov exited {done.returncode}: {done.stderr[-2000:]}")
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    reports = report if isinstance(report, list) else [report]
    findings = []
    for rep in reports:
        for failed in rep.get("results", {}).get("failed_checks", []):
            render = failed["file_path"].lstrip("/").split("/")[0]
            # resource: KIND.NAMESPACE.NAME, but the graph checks' (CKV2_*) pod of a workload is
            # Pod.NAME.<its labels> (none of our names has a dot)
            kind, namespace, name = failed["resource"].split(".", 2)
            if kind == "Pod" and failed["check_id"].startswith("CKV2_"):
                namespace, name = "", namespace
            findings.append(Finding(render, failed["check_id"], kind, namespace, name))
    return sorted(findings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nvidia", type=Path, help="a checkout of NVIDIA/gpu-operator v26.7.0")
    parser.add_argument(
        "--nvidia-dra",
        type=Path,
        help="NVIDIA/k8s-dra-driver-gpu's chart (deployments/helm/dra-driver-nvidia-gpu)",
    )
    parser.add_argument(
        "--keep", type=Path, help="write the renders here (kept) instead of a temporary folder"
    )
    parser.add_argument("--findings", action="store_true", help="list every failed check of ours")
    args = parser.parse_args(argv)
    ours = our_renders()
    found = Counter(f.render for f in run_checkov(ours, args.keep and args.keep / "ours"))
    theirs: Counter[str] = Counter()
    if args.nvidia:
        theirs = Counter(
            f.render
            for f in run_checkov(
                nvidia_renders(args.nvidia, ours, args.nvidia_dra), args.keep and args.keep / "nvidia"
            )
        )
    print("| render | ours | NVIDIA v26.7.0 |")
    print("| --- | ---: | ---: |")
    for render in ours:
        nv = str(theirs[render]) if args.nvidia else "-"
        print(f"| {render} | {found[render]} | {nv} |")
    if args.findings:
        for f in run_checkov(ours):
            print(f.render, f.check, f.kind, f.namespace, f.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
