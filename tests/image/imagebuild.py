"""Builds the image with tools/image/build.sh for the image tests (one architecture per call)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A cold build (Debian's packages fetched, arm64's configured under qemu) beside the suite's other
# work took longer than pytest's default 600 s on 2 cores: the image tests' items (their module
# fixtures build in the first item's setup) may take the build's own limit and a minute more.
BUILD_TIMEOUT = 2400
TIMEOUT = pytest.mark.timeout(BUILD_TIMEOUT + 60)


@dataclass(frozen=True)
class Built:
    digest: str
    size: int
    oci_archive: Path
    ref: str

    def sibling(self, suffix: str) -> Path:
        return self.oci_archive.with_name(self.oci_archive.name.removesuffix(".oci.tar") + suffix)


def build(out: Path, arch: str = "amd64") -> Built:
    env = {**os.environ, "IMAGE_OUT": str(out), "PYTHON": str(REPO / ".venv" / "bin" / "python")}
    done = subprocess.run(
        [str(REPO / "tools" / "image" / "build.sh"), "--arch", arch],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
        timeout=BUILD_TIMEOUT,
    )
    if done.returncode != 0:
        pytest.fail(f"tools/image/build.sh --arch {arch} exited {done.returncode}:\n{done.stderr[-4000:]}")
    digest, size, archive, ref = done.stdout.strip().splitlines()[-1].split()
    return Built(digest, int(size), Path(archive) if Path(archive).is_absolute() else REPO / archive, ref)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def oci_blob(archive: Path, digest: str) -> bytes:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        assert member is not None, f"{archive} has no blob {digest}"
        return member.read()


def oci_blob_index(archive: Path) -> bytes:
    """The OCI layout's index.json in an OCI archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None, f"{archive} has no index.json"
        return member.read()
