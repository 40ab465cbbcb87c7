"""tools/image/requirements.lock (what the image installs) agrees with pyproject's pins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_lock_pins_every_dependency_at_pyprojects_version_with_a_hash() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lock: dict[str, str] = {}
    for line in (REPO / "tools/image/requirements.lock").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        spec, _, hashes = line.partition(" ")
        # one hash per distinct wheel: amd64 and arm64 share pure-Python wheels
        assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}( --hash=sha256:[0-9a-f]{64})?", hashes), \
            f"lock line without a hash per architecture's wheel: {line}"
        name, version = spec.split("==")
        lock[norm(name)] = version
    assert lock and pyproject["project"]["dependencies"], "an empty lock or dependency list checks nothing"
    for dep in pyproject["project"]["dependencies"]:
        name, version = dep.split("==")
        assert lock.get(norm(name)) == version, (
            f"tools/image/requirements.lock has {name} at {lock.get(norm(name))}, pyproject.toml at "
            f"{version}: run tools/image/lock.sh"
        )


def test_chart_and_renderer_default_to_the_image_the_build_names() -> None:
    import yaml

    from gpu_operator.render.defaults import OWN_IMAGE

    chart = yaml.safe_load((REPO / "deployments/gpu-operator/Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "deployments/gpu-operator/values.yaml").read_text())
    built = f"{values['operator']['repository']}/{values['operator']['image']}:{chart['appVersion']}"
    assert built == OWN_IMAGE
    for component in ("validator", "nodeStatusExporter"):
        assert (values[component]["repository"], values[component]["image"]) == (
            values["operator"]["repository"], values["operator"]["image"]), component
