"""The same image for arm64 (Grace Hopper nodes), built on this amd64 machine without Docker:
Debian's arm64 packages and the lock file's arm64 wheels, the root's programs run by
qemu-user-static through binfmt_misc. Reproducible like the amd64 image, runs under qemu here,
and joins the amd64 image in one multi-arch index. Fails (never skips) when qemu cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.imagebuild import REPO, TIMEOUT, Built, build, oci_blob, oci_blob_index, sha256

pytestmark = [pytest.mark.image, TIMEOUT]

AARCH64 = 0xB7  # ELF e_machine


@pytest.fixture(scope="module")
def arm64(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("image-arm64"), "arm64")


def _config(image: Built) -> dict[str, object]:
    index = json.loads(oci_blob_index(image.oci_archive))
    manifest = json.loads(oci_blob(image.oci_archive, index["manifests"][0]["digest"]))
    return dict(json.loads(oci_blob(image.oci_archive, manifest["config"]["digest"])))


@pytest.fixture(scope="module")
def arm64_root(arm64: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The arm64 image's root filesystem, unpacked (its one layer)."""
    root = tmp_path_factory.mktemp("arm64-root")
    config = _config(arm64)
    assert config["architecture"] == "arm64" and config["os"] == "linux", config
    index = json.loads(oci_blob_index(arm64.oci_archive))
    manifest = json.loads(oci_blob(arm64.oci_archive, index["manifests"][0]["digest"]))
    assert len(manifest["layers"]) == 1, manifest
    layer = root.parent / "layer.tar"
    layer.write_bytes(oci_blob(arm64.oci_archive, manifest["layers"][0]["digest"]))
    subprocess.run(["tar", "-xpf", str(layer), "--numeric-owner", "-C", str(root)], check=True)
    return root


def test_a_second_arm64_build_gives_the_same_digest(arm64: Built, tmp_path: Path) -> None:
    again = build(tmp_path, "arm64")
    assert again.digest == arm64.digest
    assert sha256(again.oci_archive) == sha256(arm64.oci_archive), "the arm64 OCI archives differ byte-wise"
    assert arm64.oci_archive.name.endswith("-arm64.oci.tar") and arm64.ref.endswith(
        ":" + arm64.ref.rsplit(":")[-1]
    )


def test_the_arm64_image_holds_arm64_programs(arm64_root: Path) -> None:
    python = (arm64_root / "usr/bin/python3.11").resolve()
    header = python.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == AARCH64, python
    # the native extensions pip installed are the arm64 wheels'
    core = next(
        (arm64_root / "usr/local/lib/python3.11/dist-packages").glob("pydantic_core/_pydantic_core*.so")
    )
    assert "aarch64" in core.name, core.name


def test_the_arm64_image_runs_under_qemu_user(arm64_root: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("running the arm64 root needs root (chroot): run the tests as root")
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    assert binfmt.exists() and binfmt.read_text().startswith("enabled"), (
        "qemu-user-static is not registered for aarch64: ./dev image --arch arm64 sets it up"
    )
    done = subprocess.run(
        [
            "chroot",
            "--userspec=65532:65532",
            str(arm64_root),
            "/usr/bin/env",
            "-i",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "HOME=/tmp",
            "gpu-operator",
            "--help",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Usage: gpu-operator" in done.stdout


def test_the_multi_arch_index_names_both_images(built: Built, arm64: Built, tmp_path: Path) -> None:
    def index(out: Path) -> str:
        done = subprocess.run(
            [
                sys.executable,
                str(REPO / "tools/image/index.py"),
                "--tag",
                "t",
                "--mtime",
                "0",
                "--out",
                str(out),
                str(built.oci_archive),
                str(arm64.oci_archive),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    digest = index(tmp_path / "a.oci.tar")
    assert index(tmp_path / "b.oci.tar") == digest
    assert sha256(tmp_path / "a.oci.tar") == sha256(tmp_path / "b.oci.tar")
    layout = json.loads(oci_blob_index(tmp_path / "a.oci.tar"))
    assert [m["digest"] for m in layout["manifests"]] == [digest]
    images = json.loads(oci_blob(tmp_path / "a.oci.tar", digest))["manifests"]
    assert {(m["platform"]["architecture"], m["digest"]) for m in images} == {
        ("amd64", built.digest),
        ("arm64", arm64.digest),
    }
    # skopeo reads it as a multi-arch image and finds the arm64 one by platform
    inspected = subprocess.run(
        ["skopeo", "inspect", "--override-arch", "arm64", f"oci-archive:{tmp_path / 'a.oci.tar'}:t"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["Architecture"] == "arm64"
