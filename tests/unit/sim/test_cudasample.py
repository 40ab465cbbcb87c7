"""The CUDA sample stand-in image: our image's layers plus one holding /usr/bin/vectorAdd, tagged
for the real node, built the same way twice."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from gpu_operator.sim.realnode import cudasample


def _base(path: Path) -> Path:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = b"base"
        info = tarfile.TarInfo("etc/base")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    digest = hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["gpu-operator"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
        }
    ).encode()
    with tarfile.open(path, "w") as tar:
        for name, blob in (
            (f"{digest}.tar", layer.getvalue()),
            ("base.json", config),
            (
                "manifest.json",
                json.dumps(
                    [{"Config": "base.json", "RepoTags": ["ours:1"], "Layers": [f"{digest}.tar"]}]
                ).encode(),
            ),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def test_the_stand_in_adds_one_layer_with_vectoradd_and_its_own_tag(tmp_path: Path) -> None:
    base = _base(tmp_path / "base.tar")
    out = cudasample.build(base, tmp_path / "sample.tar")
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        (entry,) = manifest
        assert entry["RepoTags"] == [cudasample.CUDA_SAMPLE_IMAGE]
        base_layer, new_layer = entry["Layers"]
        config = json.load(tar.extractfile(entry["Config"]))  # type: ignore[arg-type]
        layer_bytes = tar.extractfile(new_layer).read()  # type: ignore[union-attr]
        assert config["rootfs"]["diff_ids"][-1] == f"sha256:{hashlib.sha256(layer_bytes).hexdigest()}"
        assert len(config["rootfs"]["diff_ids"]) == 2 and tar.extractfile(base_layer) is not None
        with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer:
            member = layer.getmember("usr/bin/vectorAdd")
            assert member.mode & 0o111
            script = layer.extractfile(member).read().decode()  # type: ignore[union-attr]
    assert script == cudasample.VECTOR_ADD
    again = cudasample.build(base, tmp_path / "again.tar")
    assert again.read_bytes() == out.read_bytes()


def test_the_stand_in_fails_where_no_gpu_was_given_and_says_what_is_missing() -> None:
    """Here (no NVIDIA driver, no /dev/nvidia*): exit 1, the sample's error, each missing part."""
    assert not Path("/dev/nvidiactl").exists(), (
        "this test runs the stand-in on a machine without NVIDIA's driver"
    )
    done = subprocess.run(
        [sys.executable, "-c", cudasample.VECTOR_ADD], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "no CUDA-capable device is detected" in done.stdout
    assert "libcuda.so.1" in done.stdout and "/dev/nvidiactl is missing" in done.stdout
    assert "no GPU device /dev/nvidiaN" in done.stdout
