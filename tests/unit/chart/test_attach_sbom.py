"""tools/chart/attach_sbom.py picks the SBOM of each image it attaches to: for a single-architecture
archive the SBOM beside it; for a multi-arch index (tools/image/index.py) each platform's manifest
with the SBOM of the archive that holds it. A missing SBOM is named."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parents[3] / "tools"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


attach = _load("attach_sbom", TOOLS / "chart" / "attach_sbom.py")
index_tool = _load("image_index", TOOLS / "image" / "index.py")


def _single(out: Path, arch: str) -> str:
    """A one-image OCI archive for ``arch`` (config and manifest only); returns its manifest digest."""
    config = json.dumps({"architecture": arch, "os": "linux"}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {"schemaVersion": 2, "config": {"digest": config_digest, "size": len(config)}}
    ).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    layout = {
        "schemaVersion": 2,
        "manifests": [{"mediaType": MANIFEST, "digest": digest, "size": len(manifest)}],
    }
    files = {
        "index.json": json.dumps(layout).encode(),
        f"blobs/sha256/{config_digest[7:]}": config,
        f"blobs/sha256/{digest[7:]}": manifest,
    }
    with tarfile.open(out, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return digest


def test_a_single_image_gets_the_sbom_beside_it(tmp_path: Path) -> None:
    digest = _single(tmp_path / "gpu-operator-1.0.oci.tar", "amd64")
    (tmp_path / "gpu-operator-1.0.sbom.cdx.json").write_text("{}")
    (found,) = attach.subjects(tmp_path / "gpu-operator-1.0.oci.tar")
    assert found == (
        {"mediaType": MANIFEST, "digest": digest, "size": found[0]["size"]},
        tmp_path / "gpu-operator-1.0.sbom.cdx.json",
    )


def test_each_platform_of_an_index_gets_its_own_sbom(tmp_path: Path) -> None:
    amd64 = _single(tmp_path / "gpu-operator-1.0.oci.tar", "amd64")
    arm64 = _single(tmp_path / "gpu-operator-1.0-arm64.oci.tar", "arm64")
    for name in ("gpu-operator-1.0", "gpu-operator-1.0-arm64"):
        (tmp_path / f"{name}.sbom.cdx.json").write_text(name)
    index = tmp_path / "gpu-operator-1.0.index.oci.tar"
    blobs, body = index_tool.join(
        [tmp_path / "gpu-operator-1.0.oci.tar", tmp_path / "gpu-operator-1.0-arm64.oci.tar"], "1.0"
    )
    index_tool.write(index, blobs, body, "1.0", 0)
    found = {d["digest"]: sbom.name for d, sbom in attach.subjects(index)}
    assert found == {amd64: "gpu-operator-1.0.sbom.cdx.json", arm64: "gpu-operator-1.0-arm64.sbom.cdx.json"}

    (tmp_path / "gpu-operator-1.0-arm64.sbom.cdx.json").unlink()
    with pytest.raises(attach.PushError) as missing:
        attach.subjects(index)
    assert str(missing.value) == (
        f"{tmp_path / 'gpu-operator-1.0-arm64.sbom.cdx.json'} is missing: "
        "`./dev image` writes it beside gpu-operator-1.0-arm64.oci.tar"
    )
