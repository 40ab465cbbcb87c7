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
        assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}( --hash=sha256:[0-9a-f]{64})?", hashes), (
            f"lock line without a hash per architecture's wheel: {line}"
        )
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
            values["operator"]["repository"],
            values["operator"]["image"],
        ), component


BUILD_LOCK = REPO / "tools/image/build-requirements.lock"


def _build_lock() -> dict[str, tuple[str, str]]:
    pins: dict[str, tuple[str, str]] = {}
    for line in BUILD_LOCK.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        spec, _, hashes = line.partition(" ")
        assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", hashes), (
            f"build lock line without one hash: {line}"
        )
        name, version = spec.split("==")
        pins[norm(name)] = (version, hashes.removeprefix("--hash=sha256:"))
    return pins


def test_the_image_build_tools_are_pinned_by_hash_and_satisfy_the_build_system() -> None:
    from packaging.requirements import Requirement

    pins = _build_lock()
    assert set(pins) == {"pip", "setuptools", "wheel", "packaging"}, pins
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for requirement in map(Requirement, pyproject["build-system"]["requires"]):
        assert requirement.specifier.contains(pins[norm(requirement.name)][0]), (
            f"tools/image/build-requirements.lock pins {requirement.name} {pins[norm(requirement.name)][0]}, "
            f"pyproject's build-system requires {requirement}"
        )


def test_build_sh_fetches_installs_and_builds_nothing_unhashed() -> None:
    """Every pip call of the image build: downloads and installs against a lock with
    --require-hashes (or our own wheel, a local file, with --no-deps), the wheel build in the
    hashed build environment without build isolation (which would fetch setuptools unpinned)."""
    script = (REPO / "tools/image/build.sh").read_text().replace("\\\n", " ")
    calls = [
        line.strip()
        for line in script.splitlines()
        if re.search(r"\bpip(_in_root\[@\]\}\")?\s.*\b(download|install|wheel)\b|^\s*fetch ", line)
        and not line.strip().startswith("#")
    ]
    assert len(calls) == 6, (
        calls
    )  # fetch (its two tries on one line) and its 2 calls, the build, 2 in the root
    for call in calls:
        if re.search(r"^fetch\b|(\bpip|\}\")\s+install\b", call) and "/tmp/install/$wheel" not in call:
            assert "--require-hashes" in call, call
        if re.search(r"\bpip wheel\b", call):
            assert "--no-build-isolation" in call and "$work/buildenv/bin/python" in call, call
        if "download" in call:
            assert call.count('"$@"') == 2, call  # fetch's: the caller's --require-hashes -r LOCK
    assert "bash tools/image/buildenv.sh" in script


def test_the_build_environment_refuses_a_wheel_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    """tools/image/buildenv.sh installs from a wheel directory; one whose setuptools wheel has
    other bytes than the lock's (a tampered cache, a swapped mirror) is refused by pip's hash
    check, and nothing is installed."""
    import subprocess
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, (version, _) in _build_lock().items():
        with zipfile.ZipFile(wheels / f"{name}-{version}-py3-none-any.whl", "w") as whl:
            whl.writestr(f"{name}/__init__.py", "raise SystemExit('tampered')\n")
    done = subprocess.run(
        ["bash", str(REPO / "tools/image/buildenv.sh"), str(wheels), str(tmp_path / "env")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr, done.stderr
    assert not list((tmp_path / "env").glob("lib/python*/site-packages/setuptools"))
