"""`sim up --real-node --helm`: our chart installed with real Helm into the simulator, the
operator Deployment and the chart's hook Jobs on the real node running our image for real.

What differs from a plain install is one values file the simulator writes and shows
(`real-node-values.yaml` in the simulator's directory); a user's `--values` files and `--set`
pairs go on top, as `helm -f ... --set ...` would.

`template` renders the chart offline with the helm command (`helm template`) for
`gpu-operator images` (install/), which reads the same `--values`/`--set` layers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.sim.plane import helmset
from gpu_operator.sim.realnode.cudasample import CUDA_SAMPLE_IMAGE

RELEASE = NAMESPACE = "gpu-operator"
CHART_DIR = Path(__file__).resolve().parents[4] / "deployments" / "gpu-operator"
VALUES_FILE = "real-node-values.yaml"
# What the chart checks before it renders a GPUCluster (templates/validations.yaml)
DRA_CAPABILITY = "resource.k8s.io/v1/DeviceClass"
Progress = Callable[[str], None]


class HelmInstallError(RuntimeError):
    """The chart could not be installed; the message says why and what to do."""


class ChartRejected(HelmInstallError):
    """`helm template` refused the values: the chart's own message."""


def real_node_values(node: str, host_root: str) -> dict[str, Any]:
    """The values the simulator's real node needs, and only those."""

    def no_chroot() -> dict[str, str]:  # a fresh dict each time: no YAML anchors in the file a user reads
        return {"name": "GPU_OPERATOR_NO_CHROOT", "value": "1"}

    return {
        # kwok nodes carry NFD's labels already; NFD's chart is not fetched offline
        "nfd": {"enabled": False},
        # the operator labels its namespace for its privileged operands
        "psa": {"enabled": True},
        # the operator and the chart's hook Jobs run on the real node (our image is in its containerd)
        "operator": {"nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [], "affinity": None},
        # our operands on the real node read its fixture host tree, not this machine's root
        "hostPaths": {"rootFS": host_root},
        "nodeStatusExporter": {"enabled": True, "env": [no_chroot()]},
        # the CUDA check's workload image (NVIDIA's CUDA sample) cannot be pulled here: its stand-in
        "validator": {
            "driver": {"env": [no_chroot()]},
            "cuda": {"env": [{"name": "CUDA_VALIDATOR_IMAGE", "value": CUDA_SAMPLE_IMAGE}]},
        },
    }


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's layering: maps merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def parse_set(pair: str, beneath: dict[str, Any] | None = None) -> dict[str, Any]:
    """One `--set` argument (comma-separated KEY=VALUE pairs, `a[0].b`, `{x,y}`) applied as Helm
    applies it onto the values beneath (sim/plane/helmset.py); a new mapping, `beneath` unchanged."""
    try:
        return helmset.apply(pair, beneath or {})
    except helmset.SetSyntaxError as err:
        raise HelmInstallError(str(err)) from err


def user_layers(
    files: list[Path], sets: list[str], beneath: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The `--values` files, then the `--set` pairs, as the layers Helm puts on top of `beneath`
    (the simulator's values, or none); HelmInstallError names a file that cannot be read or is not
    a mapping, and a malformed pair. The pairs make one last layer: the values beneath them (`beneath`
    and the files) with the pairs applied, as Helm applies --set onto its -f files (a list index
    changes one element of a list a file gave). `sim up` calls it before anything starts, so bad
    input stops it at once."""
    layers: list[dict[str, Any]] = []
    for file in files:
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except OSError as err:
            raise HelmInstallError(
                f"--values {file}: cannot read it ({err.strerror}): give the path of a readable values file"
            ) from err
        except yaml.YAMLError as err:
            where = getattr(err, "problem_mark", None)
            line = f" at line {where.line + 1}" if where is not None else ""
            problem = getattr(err, "problem", None) or "not YAML"
            raise HelmInstallError(
                f"--values {file}: not valid YAML ({problem}{line}): fix the file "
                "(e.g. `driver: {enabled: false}`)"
            ) from err
        if not isinstance(loaded, dict):
            raise HelmInstallError(
                f"--values {file}: not a mapping of values (its top level is a "
                f"{type(loaded).__name__}); write KEY: VALUE lines, e.g. driver: {{enabled: false}}"
            )
        layers.append(loaded)
    if not sets:
        return layers
    values = beneath or {}
    for layer in layers:
        values = merge(values, layer)
    for pair in sets:
        values = parse_set(pair, values)
    return [*layers, values]


def values_for(
    state_dir: Path, node: str, host_root: str, files: list[Path], sets: list[str]
) -> tuple[dict[str, Any], Path]:
    """The merged values and the path of the simulator's own values file (written here)."""
    ours = real_node_values(node, host_root)
    path = state_dir / VALUES_FILE
    path.write_text(
        "# What the simulator's real node needs on top of a plain install (gpu-operator sim).\n"
        + yaml.safe_dump(ours, sort_keys=False)
    )
    merged = ours
    for layer in user_layers(files, sets, ours):
        merged = merge(merged, layer)
    return merged, path


def chart_values() -> dict[str, Any]:
    """The chart's own defaults (values.yaml), under which Helm merges a user's layers."""
    loaded: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return loaded


def helm_command() -> str:
    """The helm a user installs with: $GPU_OPERATOR_HELM (`./dev setup` builds the version the
    simulator's Helm SDK wraps), else `helm` on PATH."""
    found = os.environ.get("GPU_OPERATOR_HELM") or shutil.which("helm")
    if not found:
        raise HelmInstallError(
            "helm is not on PATH: install Helm (the command you install the chart with), "
            "or run ./dev setup in a checkout and set GPU_OPERATOR_HELM to the path it prints"
        )
    return found


def template(
    values: dict[str, Any], namespace: str = NAMESPACE, api_versions: tuple[str, ...] = (DRA_CAPABILITY,)
) -> list[dict[str, Any]]:
    """`helm template` of our chart with these values, as an install renders it, offline: every
    object, hooks included. `api_versions` are the capabilities the chart may test
    (`--api-versions`): by default a cluster that serves DRA, so that gpuCluster.deployCR renders.
    HelmInstallError carries the chart's own message (its `fail`s name the key and the fix)."""
    if not (CHART_DIR / "Chart.yaml").exists():
        raise HelmInstallError(
            f"the chart is not in this installation ({CHART_DIR}): run from the source tree"
        )
    with tempfile.TemporaryDirectory(prefix="gpu-operator-values-") as tmp:
        file = Path(tmp) / "values.yaml"
        file.write_text(yaml.safe_dump(values))
        argv = [
            helm_command(),
            "template",
            RELEASE,
            str(CHART_DIR),
            "--namespace",
            namespace,
            "-f",
            str(file),
            *(f"--api-versions={v}" for v in api_versions),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        errors = [
            line.removeprefix("Error: ") for line in done.stderr.splitlines() if line.startswith("Error: ")
        ]
        raise ChartRejected(_chart_message(errors[-1] if errors else done.stderr))
    return [doc for doc in yaml.safe_load_all(done.stdout) if isinstance(doc, dict)]


def _chart_message(text: str) -> str:
    """A template's `fail` message without Helm's "execution error at (template:line:col): " prefix."""
    head, sep, message = text.partition("): ")
    return message.strip() if sep and "execution error at (" in head else text.strip()


def packaged_chart(target: Path) -> Path:
    """Our chart packaged (`helm package`) into directory `target`: what a user installs from a
    chart repository, not the source directory. Returns the .tgz."""
    import helm_python

    if not (CHART_DIR / "Chart.yaml").exists():
        raise HelmInstallError(
            f"the chart is not in this installation ({CHART_DIR}): run from the source tree"
        )
    target.mkdir(parents=True, exist_ok=True)
    return Path(helm_python.package(CHART_DIR, destination=target))


def install(
    kubeconfig: Path, state_dir: Path, values: dict[str, Any], progress: Progress, timeout: int = 300
) -> None:
    """`helm install gpu-operator` (namespace gpu-operator, created) with these values; idempotent:
    an existing release is upgraded with them instead."""
    import helm_python

    helm = helm_python.Config(kubeconfig_path=str(kubeconfig), namespace=NAMESPACE)
    chart_path = packaged_chart(state_dir / "chart")
    existing = RELEASE in release_names(helm)
    with helm_python.Chart.load(chart_path) as chart:
        if existing:
            progress(f"helm upgrade {RELEASE} (a release is installed already)")
            release = helm.upgrade(chart, RELEASE, values, namespace=NAMESPACE, timeout=timeout)
        else:
            progress(
                f"helm install {RELEASE} into namespace {NAMESPACE} (the CRD hook Job runs on the real node)"
            )
            release = helm.install(
                chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True, timeout=timeout
            )
    # as the helm command prints them: the chart's values report (values it ignores) is there
    if notes := str((release or {}).get("notes") or "").strip():
        progress(f"the chart's NOTES:\n{notes}")


def release_names(helm: Any) -> list[str]:
    """Every release of the namespace, in any state (a failed install too)."""
    return [str(r["name"]) for r in helm.list(all_states=True)]
