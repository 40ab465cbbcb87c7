"""`./dev chart` (tools/chart/release.py): both charts packaged as users install them, the platform
wrapper carrying our chart as a real dependency, an index with their digests, our image pinned
by digest when one is given, the same bytes from the same sources."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import helm_python
import pytest
import yaml

from tests.support.chart import find, objects
from tests.support.gpgkey import make_key

DIGEST = "sha256:" + "ab" * 32


def _tool() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "tools" / "chart" / "release.py"
    spec = importlib.util.spec_from_file_location("chart_release", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_release"] = module
    spec.loader.exec_module(module)
    return module


release = _tool()


def _render(archive: Path, values: dict[str, object] | None = None) -> list[dict[str, object]]:
    with helm_python.Chart.load(archive) as chart:
        return objects(
            chart.render(values or {}, name="gpu-operator", namespace="gpu-operator", is_install=True)
        )


def test_packages_index_and_pinned_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    archives = release.release(tmp_path / "a", DIGEST, log=lambda _m: None)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "cozy-gpu-operator-0.1.0.tgz",
        "gpu-operator-0.1.0.tgz",
        "index.yaml",
    ]
    index = yaml.safe_load((tmp_path / "a" / "index.yaml").read_text())
    for name, archive in archives.items():
        (entry,) = index["entries"][name]
        assert f"sha256:{entry['digest']}" == helm_python.digest(archive)

    ours = _render(archives["gpu-operator"])
    image = find(ours, "Deployment", "gpu-operator")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/gpu-operator-py/gpu-operator@{DIGEST}"
    spec = find(ours, "ClusterPolicy", "cluster-policy")["spec"]
    assert spec["validator"]["version"] == DIGEST and spec["nodeStatusExporter"]["version"] == DIGEST

    # the platform package installs on its own: our chart is inside it, not behind a file:// path
    platform = _render(archives["cozy-gpu-operator"], {"gpu-operator": {"nfd": {"enabled": False}}})
    assert find(platform, "ClusterPolicy", "cluster-policy")["spec"]
    again = release.release(tmp_path / "b", DIGEST, log=lambda _m: None)
    for name, archive in archives.items():
        assert again[name].read_bytes() == archive.read_bytes(), f"{name}: not reproducible"


def test_without_an_image_digest_the_package_names_the_tag(tmp_path: Path) -> None:
    said: list[str] = []
    archives = release.release(tmp_path, None, log=said.append)
    image = find(_render(archives["gpu-operator"]), "Deployment", "gpu-operator")["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    assert image == "ghcr.io/gpu-operator-py/gpu-operator:0.1.0"
    assert any("named by tag" in line for line in said)


def test_a_wrapper_pinned_to_another_chart_version_stops_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = tmp_path / "wrapper"
    shutil.copytree(release.WRAPPER, wrapper)
    meta = yaml.safe_load((wrapper / "Chart.yaml").read_text())
    meta["dependencies"][0]["version"] = "9.9.9"
    (wrapper / "Chart.yaml").write_text(yaml.safe_dump(meta))
    monkeypatch.setattr(release, "WRAPPER", wrapper)
    with pytest.raises(release.ReleaseError, match="depends on gpu-operator 9.9.9, the chart is 0.1.0"):
        release.release(tmp_path / "out", None, log=lambda _m: None)


def test_signed_packages_verify_and_a_tampered_or_foreign_one_does_not(tmp_path: Path) -> None:
    """--sign: each package gets Helm's provenance; `helm verify` (the check `helm install --verify`
    makes) accepts it with the signer's public keyring, refuses it with another one, and refuses
    an archive changed after signing."""
    ours, other = (
        make_key(tmp_path / "ours", "gpu-operator release"),
        make_key(tmp_path / "other", "someone else"),
    )
    out = tmp_path / "charts"
    archives = release.release(out, None, log=lambda _m: None, signer=release.Signer(ours.name, ours.secring))
    for archive in archives.values():
        verified = helm_python.verify(archive, ours.pubring)
        assert verified["signed_by"] == ["gpu-operator release <release@gpu-operator.invalid>"]
        assert verified["file_hash"] == helm_python.digest(archive)
        with pytest.raises(helm_python.HelmChartInvalidError):
            helm_python.verify(archive, other.pubring)
    tampered = tmp_path / "tampered" / archives["gpu-operator"].name
    tampered.parent.mkdir()
    tampered.write_bytes(archives["gpu-operator"].read_bytes() + b"\0")
    shutil.copy(
        archives["gpu-operator"].with_name(tampered.name + ".prov"),
        tampered.with_name(tampered.name + ".prov"),
    )
    with pytest.raises(helm_python.HelmChartInvalidError):
        helm_python.verify(tampered, ours.pubring)


def test_a_public_keyring_for_signing_names_the_flags_and_the_fix(tmp_path: Path) -> None:
    ours = make_key(tmp_path / "ours", "gpu-operator release")
    with pytest.raises(release.ReleaseError) as err:
        release.release(
            tmp_path / "charts", None, log=lambda _m: None, signer=release.Signer(ours.name, ours.pubring)
        )
    assert str(err.value).startswith(f"--sign 'gpu-operator release' --keyring {ours.pubring}: ")
