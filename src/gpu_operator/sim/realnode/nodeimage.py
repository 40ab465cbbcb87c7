"""Our image for the real node: the docker-archive its containerd imports, from
$GPU_OPERATOR_IMAGE_ARCHIVE or built by tools/image/build.sh when older than the sources (the
real node must run the code under test)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpu_operator.sim.plane.processes import RealNodeError

IMAGE_ENV = "GPU_OPERATOR_IMAGE_ARCHIVE"


def _newest_source(repo: Path) -> float:
    """The newest modification time among what goes into our image."""
    files = [repo / "pyproject.toml", *(repo / "tools" / "image").iterdir(), *(repo / "src").rglob("*")]
    return max(
        (f.stat().st_mtime for f in files if f.is_file() and "__pycache__" not in f.parts), default=0.0
    )


def image_archive(build: bool = True) -> Path:
    """Our image as a docker-archive for the real node: $GPU_OPERATOR_IMAGE_ARCHIVE, else the
    checkout's dist/gpu-operator-<version>.docker.tar, built by tools/image/build.sh if missing or
    older than the sources it is built from (the real node must run the code under test)."""
    from gpu_operator import __version__
    from gpu_operator.sim.plane.binaries import build_script

    if os.environ.get(IMAGE_ENV):
        return Path(os.environ[IMAGE_ENV])
    script = build_script()
    if script is None:
        raise RealNodeError(
            f"our image is needed on the real node: set ${IMAGE_ENV} to an archive made by `./dev image`"
        )
    repo = script.parents[2]
    archive = repo / "dist" / f"gpu-operator-{__version__}.docker.tar"
    if build and (not archive.exists() or _newest_source(repo) > archive.stat().st_mtime):
        done = subprocess.run(
            [str(repo / "tools" / "image" / "build.sh")],
            cwd=repo,
            check=False,
            env={**os.environ, "PYTHON": str(repo / ".venv" / "bin" / "python")},
        )
        if done.returncode != 0:
            raise RealNodeError(
                "building our image for the real node failed (tools/image/build.sh); "
                "see the messages above, or set $" + IMAGE_ENV
            )
    if not archive.exists():
        raise RealNodeError(f"{archive} is missing: run `./dev image` or set ${IMAGE_ENV}")
    return archive
